"""The HTTP contract every inference engine serves (the embedded engine and tx's vLLM engine).

Design / who owns what:
- The manager (and its client) talk to engines only through these routes and models; an engine is
  interchangeable as long as it serves them.
- Every route except `GET /health` requires the header `X-TX-Cluster-Secret` (401 otherwise).
- Bad requests answer 4xx with a JSON body `{"detail": ...}`: 400 bad input (token id outside the vocabulary,
  stop strings without a tokenizer, too long), 404 unknown adapter, 409 wrong state (weights asleep, no
  transfer group, too many adapters), 422 schema errors (n < 1, unknown field).
- Generate returns RAW logprobs: log_softmax of the unprocessed fp32 logits at the sampled tokens, the same
  numbers the trainer computes for those tokens (temperature, top-k and top-p only shape the sampling).
- Stop tokens (stop ids, EOS) and the token that completes a stop string are part of the returned tokens.
- Pause modes: `abort` ends in-flight requests now (stop reason `abort`, partial tokens and logprobs);
  `wait` lets them finish; `keep` freezes them until resume. Requests arriving during a pause (or while the
  engine sleeps) are queued until resume (wake), never rejected.
- Sleep level 1 keeps the weights off the accelerator (on CPU: in a private temp file) and wake restores them,
  adapters included; level 2 drops every weight (adapters too) and wake reloads the base from the model dir,
  so the manager must push its current weights again after a level-2 wake.
- Images: a prompt with images carries its token ids with the image placeholder tokens already spliced in (as
  many as the model's processor makes of each image), plus `images`: each image's encoded bytes (base64 in
  JSON, never pickled) and the placeholder span it fills. The embedded engine runs the model's image processor
  on them. The vLLM engine sends them to vLLM's token-in/token-out `/inference/v1/generate` as data URLs,
  each span collapsed to one placeholder that vLLM expands again, and checks vLLM's expansion against the
  spans (`engines/vllm/images.py`).
- Weight transfer: `POST /weights/init` joins a collective group in the background and returns at once;
  `POST /weights/update` returns when every tensor was received and applied; `POST /weights/finish` labels the
  version and may remove old adapters. Nothing is pickled; tensors travel over the collective only.
  An engine that shares the trainer's GPU and lists "ipc" in `weight_transports` also takes
  `POST /weights/update_ipc`: the same push as CUDA IPC handles (JSON), answered once all is applied.
- `GET /health` also says where the engine runs (device, GPU UUID, hostname) and which weight transports it
  takes; the manager picks gloo, NCCL or CUDA IPC from that (`weight_sync/transport.py`).
- `GET /health` reports `contract_version` (this module's `CONTRACT_VERSION`; an engine that reports none is
  older than version 1) and `model_fingerprint` (`tx.models.fingerprint`), so that tx can check an engine it
  did not start (`tx serve --engine-url`) before it trusts it. Bump `CONTRACT_VERSION` on any change an older
  engine would not understand.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tx.inference.weight_sync.transport import Transport
from tx.inference.weight_sync.types import IpcUpdate, TransferInit, TransferUpdate
from tx.types import (
    MAX_SAMPLES_PER_REQUEST,
    MAX_TOPK_PROMPT_LOGPROBS,
    ImageFormat,
    SampledSequence,
    SampleRequest,
    SampleResult,
    StopReason,
)

if TYPE_CHECKING:
    import httpx

    from tx.multimodal import ExpandedInput

SECRET_HEADER = "X-TX-Cluster-Secret"
CONTRACT_VERSION = 1  # reported in /health; tx refuses an external engine that reports another

ROUTE_HEALTH = "/health"  # GET, no secret
ROUTE_GENERATE = "/generate"  # POST GenerateRequest -> GenerateResponse
ROUTE_TOKENIZE = "/tokenize"  # POST TokenizeRequest -> TokenizeResponse
ROUTE_PAUSE = "/pause"  # POST PauseRequest -> StateResponse
ROUTE_RESUME = "/resume"  # POST (no body) -> StateResponse
ROUTE_SLEEP = "/sleep"  # POST SleepRequest -> StateResponse
ROUTE_WAKE_UP = "/wake_up"  # POST WakeUpRequest -> StateResponse
ROUTE_WEIGHTS_INIT = "/weights/init"  # POST TransferInit (worker rank = rank_offset) -> HealthResponse
ROUTE_WEIGHTS_UPDATE = "/weights/update"  # POST WeightsUpdateRequest -> WeightsUpdateResponse
ROUTE_WEIGHTS_UPDATE_IPC = "/weights/update_ipc"  # POST IpcWeightsUpdateRequest -> WeightsUpdateResponse
ROUTE_WEIGHTS_FINISH = "/weights/finish"  # POST WeightsFinishRequest -> HealthResponse
ROUTE_ADAPTER = "/adapters/{name}"  # DELETE -> HealthResponse

StopReasonName = Literal["stop", "length", "abort"]
PauseMode = Literal["abort", "wait", "keep"]
WakeTag = Literal["weights", "kv_cache"]
TransferState = Literal["none", "connecting", "ready", "failed"]  # the engine's weight-transfer group


def error_detail(response: httpx.Response) -> str:
    """The message of an engine's (or vLLM's) error response: `{"detail": ...}`, OpenAI's
    `{"error": {"message": ...}}`, or the raw text."""
    try:
        body = response.json()
    except ValueError:
        return response.text
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body))
        if isinstance(error, dict):
            return str(error.get("message", error))
        return str(error)
    return str(body)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptImage(_Wire):
    """An image of a prompt: its encoded bytes and the span of placeholder tokens it fills."""

    data: str = Field(description="base64 (standard alphabet) of the PNG or JPEG bytes")
    format: ImageFormat
    offset: int = Field(ge=0, description="index in prompt_token_ids of the image's first placeholder token")
    num_tokens: int = Field(ge=1, description="placeholder tokens the image fills")

    def image_bytes(self) -> bytes:
        return base64.b64decode(self.data, validate=True)


class GenerateRequest(_Wire):
    """Token ids in; `n` samples of at most `max_tokens` tokens out."""

    prompt_token_ids: list[int] = Field(min_length=1)
    images: list[PromptImage] = Field(
        default_factory=list, description="the prompt's images, in order; their placeholders are in the ids"
    )
    n: int = Field(default=1, ge=1, le=MAX_SAMPLES_PER_REQUEST, description="number of samples")
    max_tokens: int = Field(default=16, ge=0, description="new tokens per sample (0: prompt logprobs only)")
    temperature: float = Field(default=1.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, description="-1 or 0 = off")
    seed: int | None = Field(default=None, description="same seed, same samples (sample i uses seed + i)")
    stop_token_ids: list[int] = Field(default_factory=list)
    stop_strings: list[str] = Field(default_factory=list, description="checked on the decoded generated text")
    stop_at_eos: bool = Field(default=True, description="whether the model's EOS token(s) stop a sample")
    resumed_tokens: int = Field(
        default=0, ge=0, description="the last k prompt tokens were generated by an aborted pass of this sample: "
        "a stop string may start in their text (tx.inference.engines.stops)"
    )
    prompt_logprobs: bool = Field(default=False, description="logprob of every prompt token given its prefix")
    topk_prompt_logprobs: int = Field(
        default=0, ge=0, le=MAX_TOPK_PROMPT_LOGPROBS, description="k most likely tokens per position"
    )
    prompt_logprobs_last_n: int | None = Field(
        default=None, ge=0, description="only the last n prompt positions; earlier ones are null"
    )
    adapter: str | None = Field(default=None, description="a loaded adapter's name; null = the base model")

    @classmethod
    def from_sample_request(
        cls, request: SampleRequest, adapter: str | None = None, prompt: ExpandedInput | None = None
    ) -> GenerateRequest:
        """The engine request for a domain `SampleRequest`. A prompt with images must come `prompt`-expanded
        (`tx.multimodal.expand_input`); without it, the prompt must be text only."""
        params = request.params
        token_ids = prompt.token_ids if prompt is not None else request.prompt.text_tokens()
        images = [
            PromptImage(data=base64.b64encode(p.data).decode("ascii"), format=p.format, offset=p.offset,
                        num_tokens=p.num_tokens)
            for p in (prompt.images if prompt is not None else ())
        ]
        return cls(
            prompt_token_ids=token_ids,
            images=images,
            n=request.num_samples,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=params.seed,
            stop_token_ids=list(params.stop_token_ids),
            stop_strings=list(params.stop_strings),
            stop_at_eos=params.stop_at_eos,
            prompt_logprobs=request.prompt_logprobs,
            topk_prompt_logprobs=request.topk_prompt_logprobs,
            prompt_logprobs_last_n=request.prompt_logprobs_last_n,
            adapter=adapter,
        )


class GeneratedSequence(_Wire):
    token_ids: list[int]
    logprobs: list[float] = Field(description="raw logprob of each sampled token")
    stop_reason: StopReasonName


class GenerateResponse(_Wire):
    sequences: list[GeneratedSequence]
    prompt_logprobs: list[float | None] | None = Field(
        default=None, description="one per prompt position; null at position 0 and before the last n"
    )
    topk_prompt_logprobs: list[list[tuple[int, float]] | None] | None = Field(
        default=None, description="per prompt position: k (token id, logprob) pairs, best first, or null"
    )

    def to_sample_result(self) -> SampleResult:
        """The domain result; an aborted sequence raises ValueError (the caller retries or resends)."""
        import numpy as np

        if any(seq.stop_reason == "abort" for seq in self.sequences):
            raise ValueError("a sequence was aborted; resend it (see docs/engines.md §2)")
        sequences = [
            SampledSequence(s.token_ids, s.logprobs, StopReason(s.stop_reason)) for s in self.sequences
        ]
        prompt = None
        if self.prompt_logprobs is not None:
            prompt = np.array([np.nan if v is None else v for v in self.prompt_logprobs], dtype=np.float32)
        return SampleResult(sequences, prompt, _topk_arrays(self.topk_prompt_logprobs))


def _topk_arrays(rows: list[list[tuple[int, float]] | None] | None):
    """[len(prompt), k] token ids (-1 where absent) and logprobs (NaN where absent)."""
    import numpy as np

    if rows is None:
        return None
    k = max((len(row) for row in rows if row is not None), default=0)
    ids = np.full((len(rows), k), -1, dtype=np.int64)
    logprobs = np.full((len(rows), k), np.nan, dtype=np.float32)
    for i, row in enumerate(rows):
        for j, (token, value) in enumerate(row or ()):
            ids[i, j], logprobs[i, j] = token, value
    return ids, logprobs


class TokenizeRequest(_Wire):
    text: str
    add_special_tokens: bool = False


class TokenizeResponse(_Wire):
    token_ids: list[int]


class PauseRequest(_Wire):
    mode: PauseMode = "abort"


class SleepRequest(_Wire):
    level: Literal[1, 2] = 1
    mode: PauseMode = Field(default="abort", description="what happens to in-flight requests first")


class WakeUpRequest(_Wire):
    tags: list[WakeTag] | None = Field(default=None, description="null = everything")


class LoraSpec(_Wire):
    """The PEFT LoRA config of an adapter (the parts that shape its tensors and scale)."""

    r: int = Field(ge=1)
    lora_alpha: float = Field(gt=0)
    target_modules: list[str] = Field(min_length=1)


class WeightsUpdateRequest(_Wire):
    """One push. Target: `adapter` (+ its `lora` config) for LoRA tensors in PEFT state-dict names
    (`base_model.model....lora_A.weight`), or `adapter = null` for full base weights in HF names."""

    transfer: TransferUpdate
    adapter: str | None = Field(default=None, min_length=1, max_length=200)
    lora: LoraSpec | None = None

    @model_validator(mode="after")
    def _lora_with_adapter(self) -> WeightsUpdateRequest:
        if (self.adapter is None) != (self.lora is None):
            raise ValueError("give both `adapter` and `lora` for an adapter, neither for base weights")
        return self


class IpcWeightsUpdateRequest(_Wire):
    """One push as CUDA IPC handles (engines that list "ipc" in `weight_transports`; the trainer's GPU).
    Targets as in `WeightsUpdateRequest`; the sender keeps the shared buffers alive until this answers."""

    ipc: IpcUpdate
    adapter: str | None = Field(default=None, min_length=1, max_length=200)
    lora: LoraSpec | None = None

    @model_validator(mode="after")
    def _lora_with_adapter(self) -> IpcWeightsUpdateRequest:
        if (self.adapter is None) != (self.lora is None):
            raise ValueError("give both `adapter` and `lora` for an adapter, neither for base weights")
        return self


class WeightsUpdateResponse(_Wire):
    num_tensors: int
    num_bytes: int
    seconds: float


class WeightsFinishRequest(_Wire):
    version: str = Field(min_length=1)
    adapter: str | None = Field(default=None, description="whose version this is; null = the base weights")
    remove_adapters: list[str] = Field(default_factory=list, description="adapters to unload now")


class EngineStats(_Wire):
    """Counters since start: how well requests were batched."""

    num_requests: int = 0
    num_batches: int = 0
    num_decode_steps: int = 0
    num_generated_tokens: int = 0
    max_requests_per_batch: int = 0
    max_rows_per_step: int = 0


class StateResponse(_Wire):
    status: str = "ok"
    paused: bool
    sleeping_level: int = Field(description="0 awake; 1 or 2 while anything is asleep")


class HealthResponse(StateResponse):
    model: str
    contract_version: int = Field(default=CONTRACT_VERSION, description="the contract version the engine serves")
    model_fingerprint: str | None = Field(default=None, description="tx.models.fingerprint of its model")
    max_adapters: int | None = Field(default=None, description="most LoRA adapters (weight versions) it holds")
    base_version: str | None = None
    adapters: dict[str, str | None] = Field(default_factory=dict, description="name -> version label")
    asleep_tags: list[WakeTag] = Field(default_factory=list)
    weight_transfer: TransferState = "none"
    num_running: int = 0
    num_waiting: int = 0
    stats: EngineStats = Field(default_factory=EngineStats)
    device: str = Field(default="cpu", description="where the engine (its first worker) runs: cpu or cuda:N")
    gpu_uuid: str | None = Field(default=None, description="that GPU's UUID; null on cpu or when unknown")
    hostname: str | None = Field(default=None, description="the engine's host (socket.gethostname())")
    weight_transports: list[Transport] = Field(
        default_factory=lambda: ["gloo"], description="the weight transfers it takes: gloo, nccl, ipc"
    )
    transfer_ranks: int = Field(
        default=1, ge=1, description="ranks it joins a gloo/NCCL weight group with (one per tensor-parallel worker)"
    )


__all__ = [
    "CONTRACT_VERSION",
    "ROUTE_ADAPTER",
    "ROUTE_GENERATE",
    "ROUTE_HEALTH",
    "ROUTE_PAUSE",
    "ROUTE_RESUME",
    "ROUTE_SLEEP",
    "ROUTE_TOKENIZE",
    "ROUTE_WAKE_UP",
    "ROUTE_WEIGHTS_FINISH",
    "ROUTE_WEIGHTS_INIT",
    "ROUTE_WEIGHTS_UPDATE",
    "ROUTE_WEIGHTS_UPDATE_IPC",
    "SECRET_HEADER",
    "EngineStats",
    "GenerateRequest",
    "GenerateResponse",
    "GeneratedSequence",
    "HealthResponse",
    "IpcWeightsUpdateRequest",
    "LoraSpec",
    "PauseMode",
    "PauseRequest",
    "PromptImage",
    "SleepRequest",
    "StateResponse",
    "StopReasonName",
    "TokenizeRequest",
    "TokenizeResponse",
    "WakeTag",
    "WakeUpRequest",
    "WeightsFinishRequest",
    "TransferInit",
    "TransferUpdate",
    "WeightsUpdateRequest",
    "WeightsUpdateResponse",
]
