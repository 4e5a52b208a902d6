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
    # tx's own (the SDK's TrainingRun ignores fields it does not know)
    name: str | None = Field(default=None, description="tx: the run's name, set by its owner")
    tags: list[str] = Field(default_factory=list, description="tx: the run's tags, set by its owner")
    base_revision: str | None = Field(default=None, description="tx: the base model's hub commit at create "
                                      "(null: a local directory, or a run recorded before tx kept it)")
    base_fingerprint: str | None = Field(default=None, description="tx: the base weights' fingerprint at create "
                                         "(null: a run recorded before tx kept it)")


# what tx's TrainingRun adds to the SDK's (which ignores unknown fields): docs/wire-contract.md
TX_EXTRAS = frozenset({"name", "tags", "base_revision", "base_fingerprint"})


class TrainingRunsResponse(WireResponse):
    training_runs: list[TrainingRun]
    cursor: Cursor
