"""JSON bodies of the REST reads (protocol §3.1 rows 8-9 and 27-31), mirroring tinker 0.38.0.

Row 31 (DELETE a checkpoint) has no body either way: any 2xx will do.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

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
