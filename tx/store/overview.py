"""The console's reads across runs, sessions and checkpoints, within a `Scope`: one owner's rows, or, for an
operator key, everyone's. Every read that names one row checks it against the scope and raises NotFoundError
outside it, as the owner-checked reads of `store.py` do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from tx.store.tables import CheckpointRow, SamplingSessionRow, SessionRow, TrainingRunRow
from tx.types import NotFoundError


@dataclass(frozen=True)
class Scope:
    """Whose rows a read covers: `owner`'s, or everyone's (`everyone`: an operator key's view)."""

    owner: str
    everyone: bool = False

    def covers(self, owner: str) -> bool:
        return self.everyone or owner == self.owner


class Overview:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def runs(self, scope: Scope, limit: int, offset: int) -> tuple[list[TrainingRunRow], int]:
        """Runs in scope, the most recently active first, and their total."""
        query = select(TrainingRunRow)
        if not scope.everyone:
            query = query.where(TrainingRunRow.owner == scope.owner)
        with self._sessions.begin() as db:
            total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
            page = query.order_by(TrainingRunRow.last_request_time.desc(), TrainingRunRow.run_id).limit(limit)
            return list(db.scalars(page.offset(offset))), total

    def run(self, scope: Scope, run_id: str) -> TrainingRunRow:
        with self._sessions.begin() as db:
            row = db.get(TrainingRunRow, run_id)
            if row is None or not scope.covers(row.owner):
                raise NotFoundError(f"training run {run_id!r} not found")
            return row

    def checkpoints(self, scope: Scope, limit: int, offset: int,
                    run_id: str | None = None) -> tuple[list[CheckpointRow], int]:
        """Unexpired checkpoints in scope (of one run, given `run_id`), newest first, and their total."""
        now = datetime.now(timezone.utc)
        query = select(CheckpointRow).where(or_(CheckpointRow.expires_at.is_(None), CheckpointRow.expires_at > now))
        if run_id is not None:
            query = query.where(CheckpointRow.run_id == run_id)
        if not scope.everyone:
            query = query.where(CheckpointRow.owner == scope.owner)
        with self._sessions.begin() as db:
            total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
            page = query.order_by(CheckpointRow.created_at.desc(), CheckpointRow.run_id, CheckpointRow.checkpoint_id)
            return list(db.scalars(page.limit(limit).offset(offset))), total

    def sessions(self, scope: Scope, limit: int, offset: int) -> tuple[list[SessionRow], int]:
        query = select(SessionRow)
        if not scope.everyone:
            query = query.where(SessionRow.owner == scope.owner)
        with self._sessions.begin() as db:
            total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
            page = query.order_by(SessionRow.created_at.desc(), SessionRow.session_id.desc())
            return list(db.scalars(page.limit(limit).offset(offset))), total

    def session(self, scope: Scope, session_id: str) -> tuple[SessionRow, list[str], list[str]]:
        """(session, its run ids, its sampler ids) if in scope."""
        with self._sessions.begin() as db:
            row = db.get(SessionRow, session_id)
            if row is None or not scope.covers(row.owner):
                raise NotFoundError(f"session {session_id!r} not found")
            runs = db.scalars(select(TrainingRunRow.run_id).where(TrainingRunRow.session_id == session_id)
                              .order_by(TrainingRunRow.created_at))
            samplers = db.scalars(select(SamplingSessionRow.sampling_session_id)
                                  .where(SamplingSessionRow.session_id == session_id)
                                  .order_by(SamplingSessionRow.created_at))
            return row, list(runs), list(samplers)

    def session_counts(self, session_ids: list[str]) -> dict[str, tuple[int, int]]:
        """{session id: (training runs, samplers)}."""
        if not session_ids:
            return {}
        counts: dict[str, tuple[int, int]] = {sid: (0, 0) for sid in session_ids}
        with self._sessions.begin() as db:
            for sid, n in db.execute(select(TrainingRunRow.session_id, func.count())
                                     .where(TrainingRunRow.session_id.in_(session_ids))
                                     .group_by(TrainingRunRow.session_id)):
                counts[sid] = (int(n), counts[sid][1])
            for sid, n in db.execute(select(SamplingSessionRow.session_id, func.count())
                                     .where(SamplingSessionRow.session_id.in_(session_ids))
                                     .group_by(SamplingSessionRow.session_id)):
                counts[sid] = (counts[sid][0], int(n))
        return counts
