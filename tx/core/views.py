"""Training runs and their checkpoints as the API shows them: read-only views, owner-checked.

Routes get these views, never store rows; a view holds plain values, so nothing below the API
leaks through it (no session handle, no lazy loads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tx.core.checkpoints.files import TinkerPath
from tx.optimizers import ADAMW, OptimizerConfig
from tx.store.store import Store
from tx.store.tables import CheckpointRow, TrainingRunRow
from tx.types import BaseModelInfo, LoraConfig

LATEST_KINDS = ("weights", "sampler_weights")


@dataclass(frozen=True)
class CheckpointView:
    run_id: str
    checkpoint_id: str  # "<kind>/<name>"
    kind: str
    created_at: datetime
    size_bytes: int
    expires_at: datetime | None
    user_metadata: dict[str, Any] | None
    public: bool = False

    @property
    def tinker_path(self) -> str:
        return f"tinker://{self.run_id}/{self.checkpoint_id}"

    @classmethod
    def of(cls, row: CheckpointRow) -> CheckpointView:
        return cls(row.run_id, row.checkpoint_id, row.kind, _utc(row.created_at), row.size_bytes,
                   _utc(row.expires_at) if row.expires_at else None, row.user_metadata, bool(row.public))


@dataclass(frozen=True)
class RunView:
    run_id: str
    owner: str
    base_model: str
    lora: LoraConfig
    last_request_time: datetime
    corrupted: bool
    user_metadata: dict[str, Any] | None
    optimizer: OptimizerConfig = ADAMW
    last_checkpoint: CheckpointView | None = None
    last_sampler_checkpoint: CheckpointView | None = None
    name: str | None = None  # its owner's (run_labels.py)
    tags: tuple[str, ...] = ()
    base_revision: str | None = None  # the base model's weights it was created on (None: not recorded)
    base_fingerprint: str | None = None

    @classmethod
    def of(cls, row: TrainingRunRow, latest: dict[tuple[str, str], CheckpointRow] | None = None) -> RunView:
        latest = latest or {}
        last, last_sampler = latest.get((row.run_id, "weights")), latest.get((row.run_id, "sampler_weights"))
        return cls(
            run_id=row.run_id, owner=row.owner, base_model=row.base_model, lora=lora_of(row),
            last_request_time=_utc(row.last_request_time), corrupted=row.corrupted,
            user_metadata=row.user_metadata, optimizer=optimizer_of_row(row),
            last_checkpoint=CheckpointView.of(last) if last else None,
            last_sampler_checkpoint=CheckpointView.of(last_sampler) if last_sampler else None,
            name=row.name, tags=tuple(row.tags or ()), base_revision=row.base_revision,
            base_fingerprint=row.base_fingerprint,
        )


@dataclass(frozen=True)
class ModelInfoView:
    run: RunView
    base: BaseModelInfo
    tokenizer_id: str  # what the client loads its tokenizer by (a hub name, or the served directory)


class RunViews:
    def __init__(self, store: Store, base_model_info: Callable[[str], BaseModelInfo],
                 tokenizer_ids: dict[str, str]) -> None:
        self._store = store
        self._base_model_info = base_model_info
        self._tokenizer_ids = tokenizer_ids

    def list(self, owner: str, limit: int, offset: int) -> tuple[list[RunView], int]:
        rows, total = self._store.list_runs(owner, limit, offset)
        latest = self._store.latest_checkpoints([r.run_id for r in rows], LATEST_KINDS)
        return [RunView.of(row, latest) for row in rows], total

    def get(self, owner: str, run_id: str) -> RunView:
        row = self._store.get_run(run_id, owner)
        return RunView.of(row, self._store.latest_checkpoints([run_id], LATEST_KINDS))

    def checkpoints(self, owner: str, run_id: str) -> list[CheckpointView]:
        return [CheckpointView.of(row) for row in self._store.list_checkpoints(run_id, owner)]

    def weights_of(self, owner: str, tinker_path: str) -> RunView:
        """The run whose checkpoint `tinker_path` names (404 unless it exists and is the caller's or public)."""
        path = TinkerPath.parse(tinker_path)
        row = self._store.get_checkpoint(path.run_id, path.checkpoint_id, owner, public_ok=True)
        return RunView.of(self._store.get_run(path.run_id, row.owner))

    def model_info(self, owner: str, model_id: str) -> ModelInfoView:
        run = RunView.of(self._store.get_run(model_id, owner))
        return ModelInfoView(run, self._base_model_info(run.base_model), self._tokenizer_ids[run.base_model])


def optimizer_of_row(row: TrainingRunRow) -> OptimizerConfig:
    recorded = row.optimizer_config or {}
    return OptimizerConfig(recorded.get("type", "adamw"), int(recorded.get("version", 1)))


def lora_of(row: TrainingRunRow) -> LoraConfig:
    known = {k: v for k, v in (row.lora_config or {}).items() if k in LoraConfig.__dataclass_fields__}
    return LoraConfig(**{"rank": row.lora_rank, **known})


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
