"""What the web console shows, read within the caller's `Scope` (their own rows; everyone's for an operator
key): runs with their progress and per-step metrics, checkpoints, sessions and their futures' timelines.

Plain values out (no store rows), as in `views.py`. Writes (publish, TTL, delete) go through the catalog's
owner-checked calls, as from the SDK: an operator sees every checkpoint but changes only its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from tx.core.futures import FutureRegistry
from tx.core.scheduler import Scheduler
from tx.core.sessions import SessionStatus, session_status
from tx.core.timeline import Span
from tx.core.views import CheckpointView, lora_of
from tx.store.metrics import MetricPoint, RunTotals
from tx.store.overview import Scope
from tx.store.store import Store
from tx.store.tables import SessionRow, TrainingRunRow
from tx.types import LoraConfig

ACTIVE_S = 60.0  # a loaded run with calls queued, or one finished this recently, is "training", else "idle"
MAX_POINTS = 20_000  # rows of one metrics read (a run keeps at most about this many)
SDK_HEARTBEAT_S = 10.0  # the tinker SDK (0.38) heartbeats its session every 10 s while its client lives
SILENT_S = 3 * SDK_HEARTBEAT_S  # an open session this long without a heartbeat is shown "idle": its client is gone


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    session_id: str
    owner: str
    base_model: str
    lora: LoraConfig
    created_at: datetime
    last_activity: datetime
    state: str  # training | idle | unloaded | corrupted
    queued: int
    steps: int
    tokens: int
    last_loss: float | None
    name: str | None = None  # its owner's (run_labels.py)
    tags: tuple[str, ...] = ()
    base_revision: str | None = None  # the base model's weights it was created on (None: not recorded)
    base_fingerprint: str | None = None
    recorded: tuple[int, int] = (0, 0)  # (newest recorded call's seq, rows kept): moved by a call or by thinning


@dataclass(frozen=True)
class SessionSummary:
    session_id: str
    owner: str
    created_at: datetime
    display_name: str | None
    status: SessionStatus
    runs: int
    samplers: int
    last_heartbeat: datetime


@dataclass(frozen=True)
class SessionDetail:
    session: SessionSummary
    run_ids: list[str]
    sampler_ids: list[str]
    spans: list[Span]


class ConsoleViews:
    def __init__(self, store: Store, scheduler: Scheduler, futures: FutureRegistry) -> None:
        self._store = store
        self._scheduler = scheduler
        self._futures = futures

    def runs(self, scope: Scope, limit: int, offset: int) -> tuple[list[RunSummary], int]:
        rows, total = self._store.overview.runs(scope, limit, offset)
        totals = self._store.metrics.totals([r.run_id for r in rows])
        last_losses = self._last_losses(rows)
        return [self._summary(r, totals.get(r.run_id), last_losses.get(r.run_id)) for r in rows], total

    def run(self, scope: Scope, run_id: str) -> RunSummary:
        row = self._store.overview.run(scope, run_id)
        return self._summary(row, self._store.metrics.totals([run_id]).get(run_id),
                             self._last_losses([row]).get(run_id))

    def metrics(self, scope: Scope, run_id: str, after_seq: int, limit: int) -> list[MetricPoint]:
        """The run's recorded calls after `after_seq` (the console polls with the last seq it holds)."""
        self._store.overview.run(scope, run_id)
        return self._store.metrics.since(run_id, after_seq, min(limit, MAX_POINTS))

    def checkpoints(self, scope: Scope, limit: int, offset: int,
                    run_id: str | None = None) -> tuple[list[tuple[CheckpointView, str]], int]:
        """(checkpoint, its owner) in scope (of one run, given `run_id`), newest first."""
        rows, total = self._store.overview.checkpoints(scope, limit, offset, run_id)
        return [(CheckpointView.of(row), row.owner) for row in rows], total

    def sessions(self, scope: Scope, limit: int, offset: int) -> tuple[list[SessionSummary], int]:
        rows, total = self._store.overview.sessions(scope, limit, offset)
        counts = self._store.overview.session_counts([r.session_id for r in rows])
        return [_session(r, counts.get(r.session_id, (0, 0))) for r in rows], total

    def session(self, scope: Scope, session_id: str) -> SessionDetail:
        row, runs, samplers = self._store.overview.session(scope, session_id)
        spans = sorted(self._futures.timeline.spans(session_id), key=lambda s: s.submitted)
        return SessionDetail(_session(row, (len(runs), len(samplers))), runs, samplers, spans)

    def _summary(self, row: TrainingRunRow, totals: RunTotals | None, last_loss: float | None) -> RunSummary:
        last = _utc(row.last_request_time)
        if totals is not None:
            last = max(last, datetime.fromtimestamp(totals.last_finished, timezone.utc))
        queued = self._scheduler.queue_depth(row.run_id)
        trained_lately = totals is not None and time.time() - totals.last_finished < ACTIVE_S
        if row.corrupted:
            state = "corrupted"
        elif not self._scheduler.has_model(row.run_id):
            state = "unloaded"
        else:  # a run that has only been created (no call recorded) is idle, not training
            state = "training" if queued or trained_lately else "idle"
        return RunSummary(
            run_id=row.run_id, session_id=row.session_id, owner=row.owner, base_model=row.base_model,
            lora=lora_of(row), created_at=_utc(row.created_at), last_activity=last, state=state, queued=queued,
            steps=totals.steps if totals else 0, tokens=totals.total_tokens if totals else 0, last_loss=last_loss,
            name=row.name, tags=tuple(row.tags or ()), base_revision=row.base_revision,
            base_fingerprint=row.base_fingerprint, recorded=(totals.calls, totals.rows) if totals else (0, 0),
        )

    def _last_losses(self, rows: list[TrainingRunRow]) -> dict[str, float]:
        return self._store.metrics.last_values([r.run_id for r in rows], "forward_backward", "loss_per_token")


def _session(row: SessionRow, counts: tuple[int, int]) -> SessionSummary:
    last_heartbeat = _utc(row.last_heartbeat)
    return SessionSummary(
        session_id=row.session_id, owner=row.owner, created_at=_utc(row.created_at), display_name=row.display_name,
        status=_shown_status(session_status(row), last_heartbeat), runs=counts[0], samplers=counts[1],
        last_heartbeat=last_heartbeat,
    )


def _shown_status(status: SessionStatus, last_heartbeat: datetime, now: float | None = None) -> SessionStatus:
    """An open session whose client stopped heartbeating (it exited without closing it) is "idle", not "active":
    the server finishes it only after --session-timeout-s, but its client is gone after a few missed heartbeats."""
    silent_s = (time.time() if now is None else now) - last_heartbeat.timestamp()
    if status.type != "active" or silent_s < SILENT_S:
        return status
    return SessionStatus("idle", f"no heartbeat for {_duration(silent_s)}: its client has exited")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.0f} h"


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
