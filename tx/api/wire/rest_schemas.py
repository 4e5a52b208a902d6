"""JSON bodies of the REST reads and writes (protocol §3.1 rows 8-9 and 27-40), mirroring tinker 0.38.0.

Row 31 (DELETE a checkpoint) has no body either way: any 2xx will do.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from tx.api.wire.schemas import OptimizerConfig, WireRequest, WireResponse


class SupportedModel(WireResponse):
    model_name: str | None = None
    max_context_length: int | None = None
    trainable: bool | None = None
    sampleable: bool | None = None


class GetServerCapabilitiesResponse(WireResponse):
    supported_models: list[SupportedModel]


class HealthResponse(WireResponse):
    status: Literal["ok"] = "ok"


class WeightsInfoRequest(WireRequest):
    tinker_path: str


class WeightsInfoResponse(WireResponse):
    base_model: str
    is_lora: bool
    optimizer_config: OptimizerConfig = Field(default_factory=OptimizerConfig)
    lora_rank: int | None = None
    train_unembed: bool | None = None
    train_mlp: bool | None = None
    train_attn: bool | None = None


CheckpointType = Literal["training", "sampler", "external"]


class Checkpoint(WireResponse):
    checkpoint_id: str = Field(description="the tinker path's tail, e.g. 'weights/step-1'")
    checkpoint_type: CheckpointType
    time: datetime
    tinker_path: str
    size_bytes: int | None = None
    public: bool = False
    user_metadata: dict[str, str] | None = None
    expires_at: datetime | None = None


class Cursor(WireResponse):
    offset: int
    limit: int
    total_count: int


class CheckpointsListResponse(WireResponse):
    checkpoints: list[Checkpoint]
    cursor: Cursor | None = None


class TrainingRun(WireResponse):
    training_run_id: str
    base_model: str
    model_owner: str
    is_lora: bool
    last_request_time: datetime
    corrupted: bool = False
    lora_rank: int | None = None
    last_checkpoint: Checkpoint | None = None
    last_sampler_checkpoint: Checkpoint | None = None
    user_metadata: dict[str, str] | None = None


class TrainingRunsResponse(WireResponse):
    training_runs: list[TrainingRun]
    cursor: Cursor


class CheckpointTtlRequest(WireRequest):
    """PUT .../checkpoints/{id}/ttl: seconds from now (1 hour to 10 years), or null for never."""

    ttl_seconds: int | None = None


class ExternalWeightsUrlsResponse(WireResponse):
    urls: dict[str, str] = Field(description="signed URL per file, by its path in the checkpoint")
    expires: datetime


# Sessions (rows 36-40)


class ListSessionsResponse(WireResponse):
    sessions: list[str]


class GetSessionResponse(WireResponse):
    training_run_ids: list[str]
    sampler_ids: list[str]
    user_metadata: dict[str, str] | None = None
    display_name: str | None = None


class AssignProjectRequest(WireRequest):
    project_id: str = Field(min_length=1, max_length=128)


class TraceExportResponse(WireResponse):
    status: Literal["pending", "ready", "failed"]
    url: str | None = None
    error: str | None = None


class SessionStatusQuery(WireRequest):
    type: Literal["active", "cancelled", "failed", "client_finished"]
    reasons: list[Literal["success", "errored", "interrupted"]] | None = Field(None, min_length=1)


class SessionSearchOwner(WireRequest):
    type: Literal["own", "accessible", "user"] = "own"
    owner_urns: list[str] | None = None


class SessionSearchCursor(WireRequest):
    last_created_at: datetime
    last_session_id: str


class SessionSearchRequest(WireRequest):
    session_id: str | None = None
    project_ids: list[str] | None = None
    user_metadata: dict[str, str] = Field(default_factory=dict)
    display_name: str | None = Field(None, min_length=1)
    owner: SessionSearchOwner = Field(default_factory=SessionSearchOwner)
    statuses: list[SessionStatusQuery] | None = Field(None, min_length=1)
    limit: int = Field(50, ge=1, le=200)
    cursor: SessionSearchCursor | None = None


class SessionSummary(WireResponse):
    session_id: str
    created_at: datetime
    owner: str
    project_id: str
    status: dict[str, Any] | None = None
    checkpoints_count: int
    display_name: str | None = None
    user_metadata: dict[str, str] | None = None
    checkpoint_storage_bytes: int | None = None


class SessionSearchResponse(WireResponse):
    sessions: list[SessionSummary]
    next_cursor: SessionSearchCursor | None = None
