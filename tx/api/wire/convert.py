"""JSON wire schemas -> domain types, with the checks that turn bad input into a `UserError`.

Nothing below the API sees a wire object: routes validate a body with a schema from
`schemas/`, then call one of these.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from tx.api.wire.codec import image_chunk
from tx.api.wire.schemas import asample, models
from tx.api.wire.tensors import densify_csr, reshape_dense
from tx.multimodal.audio import decode_dmel
from tx.optimizers import AdamParams, DimuonParams, OptimizerConfig, OptimParams
from tx.types import (
    MAX_PROMPT_ALT_CELLS,
    MAX_SAMPLES_PER_REQUEST,
    MAX_TOPK_PROMPT_LOGPROBS,
    Chunk,
    ImageAssetPointer,
    LoraConfig,
    ModelInput,
    SampleRequest,
    SamplingParams,
    TargetTokens,
    TextChunk,
    UserError,
)

# Seeds are folded into [0, 2**63 - 1) so every engine sees an int64-safe value.
_SEED_MODULUS = 2**63 - 1


def model_input_from_json(model_input: asample.ModelInputJson) -> ModelInput:
    chunks: list[Chunk] = []
    for index, chunk in enumerate(model_input.chunks):
        try:
            chunks.append(_chunk_from_json(chunk))
        except UserError as exc:
            raise UserError(f"prompt chunk {index}: {exc}") from exc
    return ModelInput(chunks=tuple(chunks))


def _chunk_from_json(chunk: asample.ModelInputChunkJson) -> Chunk:
    if isinstance(chunk, asample.EncodedTextChunkJson):
        return TextChunk(tokens=tuple(chunk.tokens))
    if isinstance(chunk, asample.ImageChunkJson):
        return image_chunk(_b64decode(chunk.data, "image data"), chunk.format, chunk.expected_tokens)
    if isinstance(chunk, asample.ImageAssetPointerChunkJson):
        if not chunk.location:
            raise UserError("image_asset_pointer has an empty location")
        return ImageAssetPointer(
            location=chunk.location, format=chunk.format, expected_tokens=chunk.expected_tokens
        )
    return decode_dmel(_b64decode(chunk.dmel, "dmel data"))


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UserError(f"{what} is not valid base64: {exc}") from exc


def tensor_data_from_json(tensor: asample.TensorDataJson, *, pad_value: int = 0) -> np.ndarray:
    """Dense numpy array (int64 or float32); CSR cells not listed take `pad_value`."""
    dtype = np.dtype(np.int64) if tensor.dtype == "int64" else np.dtype(np.float32)
    values = _numbers_to_array(tensor.data, dtype)
    shape = tuple(tensor.shape or ())
    if tensor.sparse_crow_indices is None and tensor.sparse_col_indices is None:
        return reshape_dense(values, shape, "tensor")
    if tensor.sparse_crow_indices is None or tensor.sparse_col_indices is None:
        raise UserError("tensor: sparse_crow_indices and sparse_col_indices must be sent together")
    crow = _numbers_to_array(tensor.sparse_crow_indices, np.dtype(np.int64))
    col = _numbers_to_array(tensor.sparse_col_indices, np.dtype(np.int64))
    return densify_csr(values, crow, col, shape, pad_value=pad_value, what="tensor")


def _numbers_to_array(numbers: list[int] | list[float], dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "f":
        return np.asarray(numbers, dtype=np.float64).astype(np.float32)
    if any(isinstance(x, float) and not x.is_integer() for x in numbers):
        raise UserError("tensor: an int64 tensor holds a non-integer value")
    try:
        return np.asarray([int(x) for x in numbers], dtype=np.int64)
    except OverflowError as exc:
        raise UserError(f"tensor: a value does not fit int64: {exc}") from exc


def lora_config_to_domain(config: models.LoraConfig | None) -> LoraConfig:
    """The SDK always sends lora_config; without one, tx uses the SDK's defaults."""
    if config is None:
        return LoraConfig()
    lora = LoraConfig(
        rank=config.rank,
        seed=config.seed,
        train_attn=config.train_attn,
        train_mlp=config.train_mlp,
        train_unembed=config.train_unembed,
    )
    lora.validate()
    return lora


def optimizer_config_to_domain(config: models.OptimizerConfig) -> OptimizerConfig:
    """`{"type":"adamw"}` or `{"type":"dimuon","version":1}`; anything else is refused (400)."""
    if config.type not in ("adamw", "dimuon"):
        raise UserError(f"optimizer {config.type!r} is not supported: this server trains with adamw or dimuon")
    optimizer = OptimizerConfig("dimuon" if config.type == "dimuon" else "adamw",
                                config.version if config.version is not None else 1)
    optimizer.check()
    return optimizer


def optimizer_config_to_wire(optimizer: OptimizerConfig) -> models.OptimizerConfig:
    version = None if optimizer.kind == "adamw" else optimizer.version  # the SDK's AdamOptimizerConfig has none
    return models.OptimizerConfig(type=optimizer.kind, version=version)


def adam_params_to_domain(params: models.AdamParams) -> AdamParams:
    adam = AdamParams(
        learning_rate=params.learning_rate,
        beta1=params.beta1,
        beta2=params.beta2,
        eps=params.eps,
        weight_decay=params.weight_decay,
        grad_clip_norm=params.grad_clip_norm,
    )
    adam.validate()
    return adam


def optim_step_params_to_domain(request: models.OptimStepRequest) -> OptimParams:
    """AdamParams (`adam_params`) or DimuonParams (`optimizer_params` of type dimuon); other types are refused."""
    if request.adam_params is not None:
        return adam_params_to_domain(request.adam_params)
    assert request.optimizer_params is not None  # the schema holds exactly one
    params = request.optimizer_params
    if params.type != "dimuon":
        raise UserError(f"optimizer {params.type!r} is not supported: this server trains with adamw or dimuon")
    if params.learning_rate is None:
        raise UserError("DimuonParams needs a learning_rate")
    dimuon = DimuonParams(learning_rate=params.learning_rate, grad_clip_norm=params.grad_clip_norm,
                          beta1=params.beta1)
    dimuon.validate()
    return dimuon


def sample_request_to_domain(request: asample.SampleRequestJson) -> SampleRequest:
    if not 1 <= request.num_samples <= MAX_SAMPLES_PER_REQUEST:
        raise UserError(f"num_samples must be in [1, {MAX_SAMPLES_PER_REQUEST}], got {request.num_samples}")
    if not 0 <= request.topk_prompt_logprobs <= MAX_TOPK_PROMPT_LOGPROBS:
        raise UserError(
            f"topk_prompt_logprobs must be in [0, {MAX_TOPK_PROMPT_LOGPROBS}], got {request.topk_prompt_logprobs}"
        )
    prompt = model_input_from_json(request.prompt)
    if not any(not isinstance(c, TextChunk) or c.tokens for c in prompt.chunks):  # an image or a clip is tokens
        raise UserError("the prompt is empty: send at least one token")
    last_n = request.prompt_logprobs_last_n
    if last_n is not None:
        _check_prompt_logprobs_last_n(last_n, prompt, bool(request.prompt_logprobs))
    _check_sample_options(prompt, request.topk_sample_logprobs, request.prompt_alt_tokens_k)
    target = None
    if request.target_prompt_logprobs is not None:
        target = target_tokens_from_json(request.target_prompt_logprobs, prompt)
    return SampleRequest(
        prompt=prompt,
        num_samples=request.num_samples,
        params=sampling_params_to_domain(request.sampling_params),
        prompt_logprobs=bool(request.prompt_logprobs),
        topk_prompt_logprobs=request.topk_prompt_logprobs,
        prompt_logprobs_last_n=last_n,
        record_stability_info=bool(request.record_stability_info),
        topk_sample_logprobs=request.topk_sample_logprobs,
        target_prompt_logprobs=target,
        prompt_alt_tokens_k=request.prompt_alt_tokens_k,
    )


def _check_sample_options(prompt: ModelInput, topk_sample: int, alt_k: int) -> None:
    if not 0 <= topk_sample <= MAX_TOPK_PROMPT_LOGPROBS:
        raise UserError(f"topk_sample_logprobs must be in [0, {MAX_TOPK_PROMPT_LOGPROBS}], got {topk_sample}")
    if alt_k < 0:
        raise UserError(f"prompt_alt_tokens_k must be >= 0, got {alt_k}")
    if alt_k and not prompt.is_text:
        raise UserError("prompt_alt_tokens_k needs a text-only prompt on this server")
    if alt_k and alt_k * len(prompt.text_tokens()) > MAX_PROMPT_ALT_CELLS:
        raise UserError(f"len(prompt) x prompt_alt_tokens_k = {alt_k * len(prompt.text_tokens())} is over "
                        f"{MAX_PROMPT_ALT_CELLS}")


def target_tokens_from_json(tensor: asample.TensorDataJson, prompt: ModelInput) -> TargetTokens:
    """target_prompt_logprobs: int64 [len(prompt) - 1, K], dense or CSR (unlisted cells are -1, as the SDK pads),
    at least one id, at most MAX_TOPK_PROMPT_LOGPROBS distinct ids."""
    if not prompt.is_text:
        raise UserError("target_prompt_logprobs needs a text-only prompt on this server")
    if tensor.dtype != "int64" or len(tensor.shape or ()) != 2:
        raise UserError(f"target_prompt_logprobs must be a 2-D int64 tensor, got {tensor.dtype} {tensor.shape}")
    ids, rows = tensor_data_from_json(tensor, pad_value=-1), len(prompt.text_tokens()) - 1
    if ids.shape[0] != rows:
        raise UserError(f"target_prompt_logprobs needs len(prompt) - 1 = {rows} rows, got {ids.shape[0]}")
    named = np.unique(ids[ids >= 0])
    if not named.size:
        raise UserError("target_prompt_logprobs names no token id (every cell is -1)")
    if named.size > MAX_TOPK_PROMPT_LOGPROBS or ids.min() < -1:
        raise UserError(f"target_prompt_logprobs takes ids >= -1, at most {MAX_TOPK_PROMPT_LOGPROBS} distinct ones")
    csr = None
    if tensor.sparse_crow_indices is not None and tensor.sparse_col_indices is not None:
        csr = np.asarray(tensor.sparse_crow_indices, np.int64), np.asarray(tensor.sparse_col_indices, np.int64)
    return TargetTokens(ids, csr)


def _check_prompt_logprobs_last_n(last_n: int, prompt: ModelInput, prompt_logprobs: bool) -> None:
    if not prompt_logprobs:
        raise UserError("prompt_logprobs_last_n needs prompt_logprobs=true")
    if last_n < 1:
        raise UserError(f"prompt_logprobs_last_n must be >= 1, got {last_n}")
    if prompt.is_text:
        max_n = len(prompt.text_tokens()) - 1
        if last_n > max_n:
            raise UserError(f"prompt_logprobs_last_n must be <= len(prompt) - 1 = {max_n}, got {last_n}")


def sampling_params_to_domain(params: asample.SamplingParamsJson) -> SamplingParams:
    """Stop: omitted = EOS only; [] = nothing, not even EOS; ints = stop token ids (plus EOS);
    strings = stop strings (plus EOS)."""
    if params.max_tokens is not None and params.max_tokens < 1:
        raise UserError(f"max_tokens must be >= 1, got {params.max_tokens}")
    if not params.temperature >= 0:
        raise UserError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise UserError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < -1:
        raise UserError(f"top_k must be -1 (no limit) or >= 1, got {params.top_k}")
    stop = params.stop
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    if isinstance(stop, str):
        stop_strings = (stop,)
    elif stop and isinstance(stop[0], str):
        stop_strings = tuple(str(s) for s in stop)
    elif stop:
        stop_token_ids = tuple(int(t) for t in stop)
    if any(s == "" for s in stop_strings):
        raise UserError("a stop string is empty")
    defaults = SamplingParams()
    return SamplingParams(
        max_tokens=params.max_tokens if params.max_tokens is not None else defaults.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=-1 if params.top_k == 0 else params.top_k,
        seed=None if params.seed is None else params.seed % _SEED_MODULUS,
        stop_token_ids=stop_token_ids,
        stop_strings=stop_strings,
        stop_at_eos=not (stop is not None and len(stop) == 0),
    )
