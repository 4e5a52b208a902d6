"""Training runs and weights_info."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from tx.api.wire.schemas.base import Cursor, WireRequest, WireResponse
from tx.api.wire.schemas.checkpoints import Checkpoint
from tx.api.wire.schemas.models import OptimizerConfig


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
