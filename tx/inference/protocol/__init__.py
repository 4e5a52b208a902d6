"""The HTTP contract every inference engine serves (the embedded engine and tx's vLLM engine): its routes and
their request and answer models. What each route means, its errors, the raw logprobs, pause modes, sleep
levels, images and the weight transfer: docs/engines.md#the-contract. Bump `CONTRACT_VERSION` on any change
an older engine would not understand.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tx.inference.weight_sync.transport import Transport
from tx.inference.weight_sync.types import IpcUpdate, TransferInit, TransferUpdate
from tx.types import MAX_SAMPLES_PER_REQUEST, MAX_TOPK_PROMPT_LOGPROBS, ImageFormat

if TYPE_CHECKING:
    import httpx

SECRET_HEADER = "X-TX-Cluster-Secret"
# reported in /health; tx refuses an external engine that reports another (2: cache_namespace; 3: the stream
# route; 4: topk_sample_logprobs, target_token_ids, prompt_alt_tokens_k and their answers)
CONTRACT_VERSION = 4

ROUTE_HEALTH = "/health"  # GET, no secret
ROUTE_GENERATE = "/generate"  # POST GenerateRequest -> GenerateResponse; a closed connection aborts it
ROUTE_GENERATE_STREAM = "/generate/stream"  # POST GenerateRequest -> NDJSON lines (protocol/stream.py)
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


class PromptAudio(_Wire):
    """An audio clip of a prompt: its DMel levels and the span of placeholder tokens it fills (one a frame)."""

    data: str = Field(description="base64 (standard alphabet) of the levels as little-endian int32, frame by frame")
    frames: int = Field(ge=1, description="frames: the placeholder tokens the clip fills")
    bins: int = Field(ge=1, description="mel bins of each frame")
    offset: int = Field(ge=0, description="index in prompt_token_ids of the clip's first placeholder token")

    def levels(self) -> np.ndarray:
        """(frames, bins) int32 (widened only as the model's ids: `audio_inputs`); ValueError when the data is not
        frames x bins int32 values."""
        raw = base64.b64decode(self.data, validate=True)
        if len(raw) != 4 * self.frames * self.bins:
            raise ValueError(f"audio data holds {len(raw)} bytes, not {self.frames} x {self.bins} int32 values")
        return np.frombuffer(raw, dtype="<i4").reshape(self.frames, self.bins)

    @classmethod
    def of(cls, levels: np.ndarray, offset: int) -> PromptAudio:
        data = base64.b64encode(np.ascontiguousarray(levels, dtype="<i4").tobytes()).decode("ascii")
        return cls(data=data, frames=int(levels.shape[0]), bins=int(levels.shape[1]), offset=offset)


class GenerateRequest(_Wire):
    """Token ids in; `n` samples of at most `max_tokens` tokens out."""

    prompt_token_ids: list[int] = Field(min_length=1)
    images: list[PromptImage] = Field(
        default_factory=list, description="the prompt's images, in order; their placeholders are in the ids"
    )
    audio: list[PromptAudio] = Field(
        default_factory=list, description="the prompt's audio clips, in order; their placeholders are in the ids"
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
    topk_sample_logprobs: int = Field(
        default=0, ge=0, le=MAX_TOPK_PROMPT_LOGPROBS, description="k most likely tokens at each sampled position"
    )
    target_token_ids: list[list[int]] | None = Field(
        default=None, description="[len(prompt) - 1][K]: row i names ids whose logprob at prompt position i + 1 "
        "to give (-1: none); rows before the first that names one are not scored"
    )
    prompt_alt_tokens_k: int = Field(
        default=0, ge=0, description="k draws, at the request's temperature, at every prompt position after the first"
    )
    adapter: str | None = Field(default=None, description="a loaded adapter's name; null = the base model")
    cache_namespace: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[0-9a-f]+$",
        description="requests of different namespaces share no prefix-cache entries (an inflight sampling "
        "session's own, whose adapter changes weights in place); null = the shared cache",
    )


class GeneratedSequence(_Wire):
    token_ids: list[int]
    logprobs: list[float] = Field(description="raw logprob of each sampled token")
    stop_reason: StopReasonName
    topk_logprobs: list[list[tuple[int, float]]] | None = Field(
        default=None, description="per sampled token: the k most likely (token id, raw logprob), best first"
    )


class GenerateResponse(_Wire):
    sequences: list[GeneratedSequence]
    prompt_logprobs: list[float | None] | None = Field(
        default=None, description="one per prompt position; null at position 0 and before the last n"
    )
    topk_prompt_logprobs: list[list[tuple[int, float]] | None] | None = Field(
        default=None, description="per prompt position: k (token id, logprob) pairs, best first, or null"
    )
    target_prompt_logprobs: list[list[float]] | None = Field(
        default=None, description="the logprobs of target_token_ids, same shape; 0.0 where it names none"
    )
    prompt_alt_tokens: list[list[int]] | None = Field(default=None, description="[len(prompt) - 1][k] draws")
    prompt_alt_logprobs: list[list[float]] | None = Field(default=None, description="their raw logprobs")


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
    """The PEFT LoRA config of an adapter (the parts that shape its tensors and scale, and where they go)."""

    r: int = Field(ge=1)
    lora_alpha: float = Field(gt=0)
    target_modules: list[str] = Field(min_length=1)
    target_parameters: list[str] = Field(default_factory=list, description="fused expert tensors (PEFT's)")
    exclude_modules: list[str] = Field(default_factory=list, description="modules a target suffix must skip")


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
    num_joins: int = Field(default=0, description="requests that joined a batch already decoding")
    max_adapters_per_step: int = Field(default=0, description="most adapters (the base counts) in one forward")
    num_cancelled: int = Field(default=0, description="requests whose caller went away before they ended (aborted)")


class StateResponse(_Wire):
    status: str = "ok"
    paused: bool
    sleeping_level: int = Field(description="0 awake; 1 or 2 while anything is asleep")


class HealthResponse(StateResponse):
    model: str
    contract_version: int = Field(default=CONTRACT_VERSION, description="the contract version the engine serves")
    model_fingerprint: str | None = Field(default=None, description="tx.models.fingerprint of its model")
    max_adapters: int | None = Field(default=None, description="most LoRA adapters (weight versions) it holds")
    max_lora_rank: int | None = Field(default=None, description="the largest LoRA rank it takes; null: any")
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
    "ROUTE_GENERATE_STREAM",
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
    "PromptAudio",
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
