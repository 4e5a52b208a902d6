"""The audit log's rows: appended (or folded into the hour's entry), read by day (an owner's own, or all for
operators), and pruned to a bound per tenant."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, delete, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from tx.store.stability import deleted_count
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

    def fold(self, row: AuditRow, since: datetime) -> None:
        """Add `row`, or count it into the newest entry of its actor and event since `since` (its details'
        `count` goes up by one and its `last_at` is the row's time)."""
        with self._sessions.begin() as db:
            folded = db.scalars(select(AuditRow).where(AuditRow.actor == row.actor, AuditRow.event == row.event,
                                                       AuditRow.at >= since)
                                .order_by(AuditRow.id.desc()).limit(1)).first()
            if folded is None:
                db.add(row)
                return
            details = dict(folded.details or {})
            details.update(row.details or {}, count=int(details.get("count", 1)) + 1, last_at=row.at.isoformat())
            folded.details = details

    def prune(self, before: datetime, keep: int) -> int:
        """Delete entries older than `before`, then those outside every tenant's newest `keep`: an entry stays
        while it is among the newest `keep` of its actor's or of its subject owner's (the entries either may read),
        so one tenant's entries never push out another's. Returns how many went."""
        with self._sessions.begin() as db:
            gone = deleted_count(db.execute(delete(AuditRow).where(AuditRow.at < before)))
            pairs = db.execute(select(AuditRow.actor, AuditRow.subject_owner).distinct()).all()
            tenants = {t for pair in pairs for t in pair if t is not None}
            floor = {t: self._floor(db, t, keep) for t in tenants}
            for actor, subject in pairs:
                below = min(floor[actor], floor[subject if subject is not None else actor])
                if below:
                    gone += deleted_count(db.execute(delete(AuditRow).where(
                        AuditRow.actor == actor, _is(AuditRow.subject_owner, subject), AuditRow.id <= below,
                    )))
        return gone

    @staticmethod
    def _floor(db: Session, tenant: str, keep: int) -> int:
        """The id at and below which `tenant`'s entries (actor or subject) are past its newest `keep`; 0: none."""
        mine = or_(AuditRow.actor == tenant, AuditRow.subject_owner == tenant)
        return db.scalar(select(AuditRow.id).where(mine).order_by(AuditRow.id.desc()).offset(keep).limit(1)) or 0


def _is(column: InstrumentedAttribute[str | None], value: str | None) -> ColumnElement[bool]:
    return column.is_(None) if value is None else column == value
