"""JSON bodies of the Tinker API (protocol §3.1 rows 1-21, §3.2, §3.3, §3.5), mirroring tinker 0.38.0.

Requests ignore unknown keys, accept the SDK's `type` discriminators, and never require a field the
SDK leaves out when it is None (it sends `exclude_none` bodies). Responses carry exactly the fields
the SDK reads. These are wire objects only: `tx/api/wire/convert.py` turns them into domain types.
The REST listing bodies (rows 27-31) live in `tx/api/wire/rest_schemas.py`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from tx.types import ErrorCategory


class WireRequest(BaseModel):
    """A request body: unknown keys are ignored, `model_*` field names are allowed. Every text in it
    must be valid Unicode: JSON may carry a lone UTF-16 surrogate ("\\ud800"), which no store or
    response can encode, so it is refused here (422) for every field, nested ones included."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        _check_text(value)
        return value


def _check_text(value: Any) -> None:
    """Raise ValueError if any str in `value` (dict keys too) is not encodable (a lone surrogate)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text must be valid Unicode: it holds a lone UTF-16 surrogate") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_text(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, (str, dict, list, tuple)):
                _check_text(item)


MAX_METADATA_BYTES = 64 << 10
MAX_TAGS, MAX_TAG_CHARS = 64, 256


def _small_metadata(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None and len(json.dumps(value)) > MAX_METADATA_BYTES:
        raise ValueError(f"user_metadata is larger than {MAX_METADATA_BYTES} bytes as JSON")
    return value


UserMetadata = Annotated[dict[str, Any] | None, AfterValidator(_small_metadata)]
StrMetadata = Annotated[dict[str, str] | None, AfterValidator(_small_metadata)]
Tags = Annotated[list[Annotated[str, Field(max_length=MAX_TAG_CHARS)]], Field(max_length=MAX_TAGS)]


class WireResponse(BaseModel):
    """A response body built by tx."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())


# ---------------------------------------------------------------------------------------------
# Client bootstrap, sessions, telemetry (rows 1-7)


class ClientConfigRequest(WireRequest):
    sdk_version: str | None = None


class ClientConfigResponse(WireResponse):
    """Flags that steer the SDK (protocol §1.6). Defaults are tx's choices, not the SDK's."""

    pjwt_auth_enabled: bool = False
    credential_default_source: str = "api_key"
    use_pyqwest_transport: bool = Field(default=False, description="false: clients use plain httpx")
    proto_compress_fwdbwd: bool = Field(default=False, description="clients zstd-compress fwd/bwd bodies")
    parallel_fwdbwd_chunks: bool = True
    fwdbwd_max_chunk_len: int = 1024
    fwdbwd_max_chunk_bytes_count: int = 5_000_000
    fwdbwd_dispatch_bytes_semaphore_size: int = 50_000_000
    sample_dispatch_bytes_semaphore_size: int = 10 * 1024 * 1024
    inflight_response_bytes_semaphore_size: int = 50 * 1024 * 1024
    billing_exception_max_pause_duration_sec: int = 3600
    sample_no_retries: bool = False
    sample_enable_stuck_detection: bool = True
    sample_max_concurrent_requests: int = 2000
    sample_use_retrieve_futures: bool = False
    custom_loss_server_side: bool = False
    sample_join_sampling_session: bool = False


class ClientDynamicConfigResponse(WireResponse):
    refresh_interval_sec: int = 300
    sample_cancel_enabled: bool = False
    sample_cancel_max_batch_size: int = 64


class AuthTokenResponse(WireResponse):
    jwt: str


class CreateSessionRequest(WireRequest):
    tags: Tags = Field(default_factory=list)
    user_metadata: UserMetadata = None
    sdk_version: str | None = None
    project_id: str | None = None
    display_name: str | None = None
    type: Literal["create_session"] = "create_session"


class CreateSessionResponse(WireResponse):
    session_id: str
    type: Literal["create_session"] = "create_session"
    info_message: str | None = None
    warning_message: str | None = None
    error_message: str | None = None


class SessionHeartbeatRequest(WireRequest):
    session_id: str
    type: Literal["session_heartbeat"] = "session_heartbeat"


class SessionHeartbeatResponse(WireResponse):
    type: Literal["session_heartbeat"] = "session_heartbeat"


class SessionFinishReason(WireRequest):
    type: Literal["success", "errored", "interrupted"]


class SessionFinishRequest(WireRequest):
    """POST /api/v1/sessions/{session_id}/finish."""

    reason: SessionFinishReason
    detail: str | None = None


class TelemetryEvent(WireRequest):
    """One telemetry event; kind-specific fields (error_message, event_data, ...) are kept."""

    model_config = ConfigDict(extra="allow")

    event: str
    event_id: str | None = None
    event_session_index: int | None = None
    severity: str | None = None
    timestamp: str | None = None


class TelemetrySendRequest(WireRequest):
    events: list[TelemetryEvent]
    platform: str | None = None
    sdk_version: str | None = None
    session_id: str | None = None
    process_uuid: str | None = None


class TelemetryResponse(WireResponse):
    status: Literal["accepted"] = "accepted"


# ---------------------------------------------------------------------------------------------
# Models and optimizers (rows 10, 11, 13)


class LoraConfig(WireRequest):
    rank: int = 32
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class OptimizerConfig(WireRequest):
    """`{"type":"adamw"}` or `{"type":"dimuon","version":1}`; fixed for a model's life."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    type: str = "adamw"
    version: int | None = None

    @model_serializer(mode="wrap")
    def _drop_unset_version(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The SDK validates {"type":"adamw"} as its extra="forbid" AdamOptimizerConfig.
        data = handler(self)
        if data.get("version") is None:
            data.pop("version", None)
        return data


class AdamParams(WireRequest):
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


class OptimizerParams(WireRequest):
    """Non-Adam step parameters (the SDK's DimuonParams); tx rejects them."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    type: str
    learning_rate: float | None = None
    grad_clip_norm: float = 0.0
    beta1: float = 0.9


class CreateModelRequest(WireRequest):
    session_id: str
    model_seq_id: int
    base_model: str
    user_metadata: UserMetadata = None
    lora_config: LoraConfig | None = None
    optimizer_config: OptimizerConfig = Field(default_factory=OptimizerConfig)
    type: Literal["create_model"] = "create_model"


class GetInfoRequest(WireRequest):
    model_id: str
    type: Literal["get_info"] = "get_info"


class ModelData(WireResponse):
    arch: str | None = None
    model_name: str | None = Field(None, description="must be set: the SDK asserts on it")
    tokenizer_id: str | None = None


class GetInfoResponse(WireResponse):
    model_id: str
    model_data: ModelData
    optimizer_config: OptimizerConfig = Field(default_factory=OptimizerConfig)
    is_lora: bool | None = None
    lora_rank: int | None = None
    model_name: str | None = None
    type: Literal["get_info"] = "get_info"


class OptimStepRequest(WireRequest):
    """Adam sends `adam_params`; another optimizer sends `optimizer_params` instead."""

    model_id: str
    seq_id: int | None = None
    adam_params: AdamParams | None = None
    optimizer_params: OptimizerParams | None = None
    type: Literal["optim_step"] = "optim_step"

    @model_validator(mode="after")
    def _one_parameter_set(self) -> OptimStepRequest:
        if (self.adam_params is None) == (self.optimizer_params is None):
            raise ValueError("send exactly one of adam_params and optimizer_params")
        return self


# ---------------------------------------------------------------------------------------------
# Checkpoints (rows 14-17)


class SaveWeightsRequest(WireRequest):
    model_id: str
    path: str | None = Field(None, description="the checkpoint name")
    seq_id: int | None = None
    ttl_seconds: int | None = None
    overwrite: bool = False
    user_metadata: StrMetadata = None
    type: Literal["save_weights"] = "save_weights"


class SaveWeightsForSamplerRequest(WireRequest):
    """Named form: `path` (+ ttl/metadata). Ephemeral form: `sampling_session_seq_id`, no path."""

    model_id: str
    path: str | None = None
    sampling_session_seq_id: int | None = None
    kind: Literal["snapshot", "inflight"] = "snapshot"
    seq_id: int | None = None
    ttl_seconds: int | None = None
    user_metadata: StrMetadata = None
    type: Literal["save_weights_for_sampler"] = "save_weights_for_sampler"

    @model_validator(mode="after")
    def _named_or_ephemeral(self) -> SaveWeightsForSamplerRequest:
        if (self.path is None) == (self.sampling_session_seq_id is None):
            raise ValueError("send exactly one of path (named) and sampling_session_seq_id (ephemeral)")
        return self

    @property
    def is_ephemeral(self) -> bool:
        return self.path is None


class SaveWeightsExternalRequest(WireRequest):
    model_id: str
    path: str
    seq_id: int | None = None
    ttl_seconds: int | None = None
    age_encryption_recipients: list[str] | None = None
    type: Literal["save_weights_external"] = "save_weights_external"


class LoadWeightsRequest(WireRequest):
    """Create-via-load (`session_id` + `model_seq_id`, the new model's seq 0) or legacy
    `load_state` onto an existing model (`model_id` + `seq_id`)."""

    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    base_model: str | None = None
    user_metadata: UserMetadata = None
    path: str
    optimizer: bool = False
    optimizer_config: OptimizerConfig | None = None
    weights_access_token: str | None = None
    type: Literal["load_weights"] = "load_weights"

    @model_validator(mode="after")
    def _one_addressing(self) -> LoadWeightsRequest:
        create = self.session_id is not None and self.model_seq_id is not None
        if create == (self.model_id is not None):
            raise ValueError("send either session_id + model_seq_id (create-via-load) or model_id")
        return self

    @property
    def is_create_via_load(self) -> bool:
        return self.model_id is None


# ---------------------------------------------------------------------------------------------
# Sampling (rows 18-20); the asample body is in sample_schemas.py


class CreateSamplingSessionRequest(WireRequest):
    session_id: str
    sampling_session_seq_id: int
    base_model: str | None = None
    model_path: str | None = None
    type: Literal["create_sampling_session"] = "create_sampling_session"

    @model_validator(mode="after")
    def _has_a_model(self) -> CreateSamplingSessionRequest:
        if self.base_model is None and self.model_path is None:
            raise ValueError("send base_model or model_path")
        return self


class CreateSamplingSessionResponse(WireResponse):
    sampling_session_id: str
    type: Literal["create_sampling_session"] = "create_sampling_session"


class GetSamplerResponse(WireResponse):
    sampler_id: str
    base_model: str
    model_path: str | None = None


# ---------------------------------------------------------------------------------------------
# Futures (row 21) and the JSON results they carry


class RetrieveFutureRequest(WireRequest):
    request_id: str
    allow_metadata_only: bool = False


class CancelFutureRequest(WireRequest):
    request_id: str


class SamplingSessionFuturesTarget(WireRequest):
    type: Literal["sampling_session"] = "sampling_session"
    sampling_session_id: str
    cloned_sampler_id: int = Field(0, ge=0)


class FuturesRetrieveRequest(WireRequest):
    """POST /api/v1/retrieve_futures: timeout 0 = answer at once (an ack), null = long-poll."""

    target: SamplingSessionFuturesTarget
    prev_cursor: int = Field(0, ge=0)
    timeout: float | None = Field(None, ge=0)
    retrieved_request_ids: list[str] = Field(default_factory=list, max_length=10_000)


class FutureCompletion(WireResponse):
    state: Literal["finished", "failed"]
    request_id: str
    response_payload_uncompressed_size: int | None = None


class FuturesRetrieveResponse(WireResponse):
    completions: list[FutureCompletion]
    cursor: int


class UntypedAPIFuture(WireResponse):
    """The immediate answer to every async operation; asample must fill sample_sequence_ids."""

    request_id: str
    model_id: str | None = None
    sample_sequence_ids: list[str] | None = None


QueueState = Literal["active", "paused_capacity", "paused_rate_limit"]


class TryAgainResponse(WireResponse):
    request_id: str
    queue_state: QueueState = "active"
    queue_state_reason: str | None = None
    type: Literal["try_again"] = "try_again"


class RequestFailedResponse(WireResponse):
    error: str
    category: ErrorCategory


class CreateModelResponse(WireResponse):
    model_id: str
    type: Literal["create_model"] = "create_model"


class OptimStepResponse(WireResponse):
    metrics: dict[str, float] | None = None


class SaveWeightsResponse(WireResponse):
    path: Annotated[str, Field(description="tinker://<run>/weights/<name>")]
    type: Literal["save_weights"] = "save_weights"


class SaveWeightsForSamplerResponse(WireResponse):
    """Named saves set `path` (tinker://<run>/sampler_weights/<name>); ephemeral saves set
    `sampling_session_id`."""

    path: str | None = None
    sampling_session_id: str | None = None
    type: Literal["save_weights_for_sampler"] = "save_weights_for_sampler"


class SaveWeightsExternalResponse(WireResponse):
    path: Annotated[str, Field(description="tinker://<run>/external_weights/<name>")]
    size_bytes: int | None = None
    type: Literal["save_weights_external"] = "save_weights_external"


class LoadWeightsResponse(WireResponse):
    path: str | None = None
    model_id: str | None = None
    type: Literal["load_weights"] = "load_weights"


class CustomLossNode(WireRequest):
    """One torch.fx node as the SDK encodes it; tx's trainer decides what it allows (never executed as code)."""

    op: Literal["placeholder", "get_attr", "call_function", "call_method", "call_module", "output"]
    name: Annotated[str, Field(max_length=256)]
    target: Annotated[str, Field(max_length=256)]
    args: list[Any] = []
    kwargs: dict[str, Any] = {}


class CustomLossGraph(WireRequest):
    format: Literal[1] = 1
    nodes: Annotated[list[CustomLossNode], Field(max_length=4096)]


class CustomLossInput(WireRequest):
    name: Annotated[str, Field(max_length=64)]
    rank: Literal[0, 1, 2]


class CreateCustomLossRequest(WireRequest):
    session_id: str
    custom_loss_seq_id: Annotated[int, Field(ge=0)]
    name: Annotated[str, Field(max_length=256)]
    inputs: Annotated[list[CustomLossInput], Field(min_length=1, max_length=16)]
    graph: CustomLossGraph
    type: Literal["create_custom_loss"] = "create_custom_loss"


class CreateCustomLossResponse(WireResponse):
    loss_id: str
    type: Literal["create_custom_loss"] = "create_custom_loss"
