"""The audit log's rows: appended, read by day (an owner's own, or all for operators), and pruned to a bound."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from tx.store.tables import AuditRow


class AuditLog:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def add(self, row: AuditRow) -> None:
        with self._sessions.begin() as db:
            db.add(row)

    def between(self, start: datetime, end: datetime, reader: str | None, event_prefixes: tuple[str, ...] | None,
                limit: int) -> list[AuditRow]:
        """Entries in [start, end), oldest first: those `reader` did or that concern what `reader` owns (every
        entry when `reader` is None); only events starting with one of `event_prefixes`, when given."""
        query = select(AuditRow).where(AuditRow.at >= start, AuditRow.at < end)
        if reader is not None:
            query = query.where(or_(AuditRow.actor == reader, AuditRow.subject_owner == reader))
        if event_prefixes is not None:
            query = query.where(or_(*(AuditRow.event.startswith(p) for p in event_prefixes)))
        with self._sessions.begin() as db:
            return list(db.scalars(query.order_by(AuditRow.at, AuditRow.id).limit(limit)))

    def prune(self, before: datetime, keep: int) -> int:
        """Delete entries older than `before`, then all but the newest `keep`; returns how many went."""
        with self._sessions.begin() as db:
            newest = db.scalar(select(func.max(AuditRow.id))) or 0
            doomed = or_(AuditRow.at < before, AuditRow.id <= newest - keep)
            gone = db.scalar(select(func.count()).select_from(AuditRow).where(doomed)) or 0
            db.execute(delete(AuditRow).where(doomed))
        return gone
