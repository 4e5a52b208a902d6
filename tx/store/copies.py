"""The rows of copy_weights: a copy's run, made once per idempotency key, and its one checkpoint."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from tx.store.tables import CheckpointRow, SessionRow, TrainingRunRow
from tx.types import ConflictError


class WeightCopyRows:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def made_for(self, owner: str, request_key: str) -> TrainingRunRow | None:
        """The run an earlier copy request with this idempotency key made, if any."""
        with self._sessions.begin() as db:
            return db.scalar(select(TrainingRunRow).where(TrainingRunRow.owner == owner,
                                                          TrainingRunRow.copy_request == request_key))

    def add(self, session: SessionRow | None, run: TrainingRunRow, checkpoint: CheckpointRow) -> None:
        """The run holding a copy and its one checkpoint (in a new session, if given), in one transaction."""
        with self._sessions.begin() as db:
            if db.get(TrainingRunRow, run.run_id) is not None:
                raise ConflictError(f"training run {run.run_id!r} already exists")
            if session is not None:
                db.add(session)
                db.flush()
            db.add(run)
            db.flush()
            db.add(checkpoint)
