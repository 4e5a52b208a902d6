"""Persistence of sessions, training runs, checkpoints and sampling sessions.

SQLite file by default, PostgreSQL by URL. Every read that names a resource takes the caller's
`owner` and raises NotFoundError for a resource that belongs to someone else, so another key
cannot even learn that it exists.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import create_engine, delete, func, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, aliased, sessionmaker

from tx.store.audit import AuditLog
from tx.store.copies import WeightCopyRows
from tx.store.metrics import RunMetricsTable
from tx.store.migrate import upgrade_to_head
from tx.store.overview import Overview
from tx.store.stability import StabilityRecordStore
from tx.store.tables import (
    CheckpointRow,
    SamplingSessionRow,
    SessionRow,
    TrainingRunRow,
    utcnow,
)
from tx.types import ConflictError, NotFoundError, UserError


class SessionFinishedError(RuntimeError):
    """The session was finished; the client must stop using it (HTTP 410)."""


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        return engine
    return create_engine(url, pool_pre_ping=True)


def _live(now: datetime):
    """Checkpoints that have not expired (the sweeper may not have deleted an expired one yet)."""
    return or_(CheckpointRow.expires_at.is_(None), CheckpointRow.expires_at > now)


def _owned(db: Session, row_type: type, key: object, owner: str, what: str):
    """The row with primary key `key`, if it belongs to `owner`; NotFoundError otherwise (no leak)."""
    row = db.get(row_type, key)
    if row is None or row.owner != owner:
        raise NotFoundError(f"{what} not found")
    return row


class Store:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        upgrade_to_head(engine)  # the schema is the migrations' (tx/store/migrate.py)
        self.metrics = RunMetricsTable(self._sessions)
        self.overview = Overview(self._sessions)
        self.stability = StabilityRecordStore(self._sessions)  # sampled sequences' records (stability.py)
        self.audit = AuditLog(self._sessions)
        self.copies = WeightCopyRows(self._sessions)  # copy_weights' runs (copies.py)

    @classmethod
    def from_url(cls, url: str) -> Store:
        return cls(make_engine(url))

    def close(self) -> None:
        self._engine.dispose()

    # -- sessions ---------------------------------------------------------------------------
    def create_session(self, row: SessionRow) -> SessionRow:
        with self._sessions.begin() as db:
            db.add(row)
        return row

    def get_session(self, session_id: str, owner: str) -> SessionRow:
        with self._sessions.begin() as db:
            return _owned(db, SessionRow, session_id, owner, f"session {session_id!r}")

    def heartbeat(self, session_id: str, owner: str) -> None:
        with self._sessions.begin() as db:
            row = _owned(db, SessionRow, session_id, owner, f"session {session_id!r}")
            if row.finished_at is not None:
                raise SessionFinishedError(f"session {session_id!r} is finished")
            row.last_heartbeat = utcnow()

    def finish_session(self, session_id: str, owner: str, reason: str) -> None:
        """First finish wins; later ones are accepted and change nothing."""
        with self._sessions.begin() as db:
            row = _owned(db, SessionRow, session_id, owner, f"session {session_id!r}")
            if row.finished_at is None:
                row.finished_at = utcnow()
                row.finish_reason = reason

    def stale_sessions(self, last_heartbeat_before: datetime) -> list[SessionRow]:
        """Unfinished sessions whose last heartbeat is older than the given time."""
        with self._sessions.begin() as db:
            query = select(SessionRow).where(
                SessionRow.finished_at.is_(None), SessionRow.last_heartbeat < last_heartbeat_before
            )
            return list(db.scalars(query))

    def set_session_project(self, session_id: str, owner: str, project_id: str) -> None:
        with self._sessions.begin() as db:
            _owned(db, SessionRow, session_id, owner, f"session {session_id!r}").project_id = project_id

    def session_contents(self, session_id: str, owner: str) -> tuple[SessionRow, list[str], list[str]]:
        """(session, its training run ids, its sampler ids), oldest first."""
        with self._sessions.begin() as db:
            row = _owned(db, SessionRow, session_id, owner, f"session {session_id!r}")
            runs = db.scalars(select(TrainingRunRow.run_id).where(TrainingRunRow.session_id == session_id)
                              .order_by(TrainingRunRow.created_at))
            samplers = db.scalars(
                select(SamplingSessionRow.sampling_session_id)
                .where(SamplingSessionRow.session_id == session_id)
                .order_by(SamplingSessionRow.created_at)
            )
            return row, list(runs), list(samplers)

    def sessions_before(
        self, owner: str, project_ids: list[str] | None, before: tuple[datetime, str] | None, limit: int
    ) -> list[SessionRow]:
        """The owner's sessions, newest first (ties by id), strictly after the `before` cursor."""
        query = select(SessionRow).where(SessionRow.owner == owner)
        if project_ids is not None:
            query = query.where(SessionRow.project_id.in_(project_ids))
        if before is not None:
            at, session_id = before
            query = query.where(or_(SessionRow.created_at < at,
                                    (SessionRow.created_at == at) & (SessionRow.session_id < session_id)))
        query = query.order_by(SessionRow.created_at.desc(), SessionRow.session_id.desc()).limit(limit)
        with self._sessions.begin() as db:
            return list(db.scalars(query))

    def checkpoint_totals(self, session_ids: list[str]) -> dict[str, tuple[int, int]]:
        """{session id: (unexpired checkpoints, their bytes)} over the sessions' training runs."""
        query = (
            select(TrainingRunRow.session_id, func.count(), func.coalesce(func.sum(CheckpointRow.size_bytes), 0))
            .join(CheckpointRow, CheckpointRow.run_id == TrainingRunRow.run_id)
            .where(TrainingRunRow.session_id.in_(session_ids), _live(utcnow()))
            .group_by(TrainingRunRow.session_id)
        )
        with self._sessions.begin() as db:
            return {sid: (int(n), int(size)) for sid, n, size in db.execute(query)}

    def open_sessions(self, owner: str) -> int:
        """The owner's sessions not finished (its `sessions` quota)."""
        query = select(func.count()).select_from(SessionRow).where(
            SessionRow.owner == owner, SessionRow.finished_at.is_(None))
        with self._sessions.begin() as db:
            return int(db.scalar(query) or 0)

    def checkpoint_bytes(self, owner: str) -> int:
        """Bytes of the owner's unexpired checkpoints (its `checkpoint_bytes` quota)."""
        query = select(func.coalesce(func.sum(CheckpointRow.size_bytes), 0)).where(
            CheckpointRow.owner == owner, _live(utcnow()))
        with self._sessions.begin() as db:
            return int(db.scalar(query) or 0)

    def usage_by_owner(self) -> dict[str, tuple[int, int]]:
        """{owner: (open sessions, checkpoint bytes)} for every owner holding either."""
        sessions = (select(SessionRow.owner, func.count()).where(SessionRow.finished_at.is_(None))
                    .group_by(SessionRow.owner))
        sizes = (select(CheckpointRow.owner, func.sum(CheckpointRow.size_bytes)).where(_live(utcnow()))
                 .group_by(CheckpointRow.owner))
        with self._sessions.begin() as db:
            counts = {owner: int(n) for owner, n in db.execute(sessions)}
            held = {owner: int(size or 0) for owner, size in db.execute(sizes)}
        return {owner: (counts.get(owner, 0), held.get(owner, 0)) for owner in counts.keys() | held.keys()}

    def list_sessions(self, owner: str, limit: int, offset: int) -> list[str]:
        with self._sessions.begin() as db:
            query = (
                select(SessionRow.session_id)
                .where(SessionRow.owner == owner)
                .order_by(SessionRow.created_at.desc())
                .limit(limit)
                .offset(offset)
            )
            return list(db.scalars(query))

    # -- training runs ----------------------------------------------------------------------
    def create_run(self, row: TrainingRunRow) -> TrainingRunRow:
        with self._sessions.begin() as db:
            if db.get(TrainingRunRow, row.run_id) is not None:
                raise ConflictError(f"training run {row.run_id!r} already exists")
            db.add(row)
        return row

    def get_run(self, run_id: str, owner: str) -> TrainingRunRow:
        with self._sessions.begin() as db:
            return _owned(db, TrainingRunRow, run_id, owner, f"training run {run_id!r}")

    def touch_run(self, run_id: str) -> None:
        with self._sessions.begin() as db:
            row = db.get(TrainingRunRow, run_id)
            if row is not None:
                row.last_request_time = utcnow()

    def list_runs(self, owner: str, limit: int, offset: int) -> tuple[list[TrainingRunRow], int]:
        with self._sessions.begin() as db:
            where = TrainingRunRow.owner == owner
            total = db.scalar(select(func.count()).select_from(TrainingRunRow).where(where)) or 0
            query = (
                select(TrainingRunRow)
                .where(where)
                .order_by(TrainingRunRow.created_at.desc())
                .limit(limit)
                .offset(offset)
            )
            return list(db.scalars(query)), total

    def set_run_labels(self, run_id: str, owner: str, name: str | None, tags: list[str] | None) -> None:
        with self._sessions.begin() as db:
            row = _owned(db, TrainingRunRow, run_id, owner, f"training run {run_id!r}")
            row.name, row.tags = name, tags

    def runs_of_session(self, session_id: str) -> list[str]:
        with self._sessions.begin() as db:
            query = select(TrainingRunRow.run_id).where(TrainingRunRow.session_id == session_id)
            return list(db.scalars(query))

    # -- checkpoints ------------------------------------------------------------------------
    def add_checkpoint(self, row: CheckpointRow, *, overwrite: bool) -> CheckpointRow:
        with self._sessions.begin() as db:
            existing = db.get(CheckpointRow, (row.run_id, row.checkpoint_id))
            if existing is not None:
                if not overwrite:
                    raise ConflictError(f"checkpoint {row.checkpoint_id!r} already exists")
                db.delete(existing)
                db.flush()
            db.add(row)
        return row

    def get_checkpoint(self, run_id: str, checkpoint_id: str, owner: str, *, public_ok: bool = False) -> CheckpointRow:
        """The caller's unexpired checkpoint; with `public_ok`, also anyone's published one."""
        with self._sessions.begin() as db:
            row = db.get(CheckpointRow, (run_id, checkpoint_id))
            if (row is None or not (row.owner == owner or (public_ok and bool(row.public)))
                    or (row.expires_at is not None and _aware(row.expires_at) <= utcnow())):
                raise NotFoundError(f"checkpoint tinker://{run_id}/{checkpoint_id} not found")
            return row

    def list_checkpoints(self, run_id: str, owner: str) -> list[CheckpointRow]:
        self.get_run(run_id, owner)
        with self._sessions.begin() as db:
            query = (
                select(CheckpointRow)
                .where(CheckpointRow.run_id == run_id, _live(utcnow()))
                .order_by(CheckpointRow.created_at)
            )
            return list(db.scalars(query))

    def list_user_checkpoints(self, owner: str, limit: int, offset: int) -> tuple[list[CheckpointRow], int]:
        """One page of the owner's unexpired checkpoints across runs, newest first, and their total."""
        where = (CheckpointRow.owner == owner, _live(utcnow()))
        with self._sessions.begin() as db:
            total = db.scalar(select(func.count()).select_from(CheckpointRow).where(*where)) or 0
            query = (
                select(CheckpointRow).where(*where)
                .order_by(CheckpointRow.created_at.desc(), CheckpointRow.run_id, CheckpointRow.checkpoint_id)
                .limit(limit).offset(offset)
            )
            return list(db.scalars(query)), total

    def update_checkpoint(self, run_id: str, checkpoint_id: str, owner: str, **values: object) -> None:
        """Set `expires_at` and/or `public` on the owner's checkpoint."""
        unknown = set(values) - {"expires_at", "public"}
        if unknown:
            raise UserError(f"cannot change {sorted(unknown)} of a checkpoint")
        self.get_checkpoint(run_id, checkpoint_id, owner)
        with self._sessions.begin() as db:
            row = db.get(CheckpointRow, (run_id, checkpoint_id))
            for name, value in values.items():
                setattr(row, name, value)

    def latest_checkpoints(self, run_ids: list[str], kinds: tuple[str, ...]) -> dict[tuple[str, str], CheckpointRow]:
        """The newest checkpoint of each kind of each run, by (run_id, kind), in one query."""
        if not run_ids:
            return {}
        rank = (
            func.row_number()
            .over(partition_by=(CheckpointRow.run_id, CheckpointRow.kind), order_by=CheckpointRow.created_at.desc())
            .label("rank")
        )
        ranked = (
            select(CheckpointRow, rank)
            .where(CheckpointRow.run_id.in_(run_ids), CheckpointRow.kind.in_(kinds), _live(utcnow()))
            .subquery()
        )
        newest = aliased(CheckpointRow, ranked)
        with self._sessions.begin() as db:
            rows = db.scalars(select(newest).where(ranked.c.rank == 1))
            return {(row.run_id, row.kind): row for row in rows}

    def delete_checkpoint(self, run_id: str, checkpoint_id: str, owner: str) -> None:
        with self._sessions.begin() as db:
            _owned(db, CheckpointRow, (run_id, checkpoint_id), owner, f"checkpoint tinker://{run_id}/{checkpoint_id}")
            db.execute(
                delete(CheckpointRow).where(
                    CheckpointRow.run_id == run_id, CheckpointRow.checkpoint_id == checkpoint_id
                )
            )

    def expired_checkpoints(self, now: datetime) -> list[CheckpointRow]:
        with self._sessions.begin() as db:
            query = select(CheckpointRow).where(
                CheckpointRow.expires_at.is_not(None), CheckpointRow.expires_at < now
            )
            return list(db.scalars(query))

    # -- sampling sessions ------------------------------------------------------------------
    def create_sampling_session(self, row: SamplingSessionRow) -> SamplingSessionRow:
        with self._sessions.begin() as db:
            if db.get(SamplingSessionRow, row.sampling_session_id) is None:
                db.add(row)
        return row

    def join_sampling_session(self, sampling_session_id: str, owner: str) -> int:
        """A new client of the owner's sampling session: its number, unique in the session (the original is 0)."""
        with self._sessions.begin() as db:
            _owned(db, SamplingSessionRow, sampling_session_id, owner, f"sampler {sampling_session_id!r}")
            db.execute(update(SamplingSessionRow)
                       .where(SamplingSessionRow.sampling_session_id == sampling_session_id)
                       .values(clients_joined=SamplingSessionRow.clients_joined + 1))
            return int(db.scalar(select(SamplingSessionRow.clients_joined)
                                 .where(SamplingSessionRow.sampling_session_id == sampling_session_id)) or 0)

    def get_sampling_session(self, sampling_session_id: str, owner: str) -> SamplingSessionRow:
        with self._sessions.begin() as db:
            return _owned(db, SamplingSessionRow, sampling_session_id, owner, f"sampler {sampling_session_id!r}")


def _aware(value: datetime) -> datetime:
    """SQLite hands datetimes back without a zone; every time tx stores is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
