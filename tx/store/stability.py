"""Persistence of stability records (`StabilityRecordRow`): the sequences sampled with `record_stability_info`.

Reads take the caller's `owner` and return only its rows: another key's record looks absent. The rules (the
cap, the day a record lives, which session may use it) are the core's (`tx/core/sampling/records.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime

from sqlalchemy import CursorResult, delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from tx.store.tables import StabilityRecordRow

_CHUNK = 500  # ids per IN (...) clause: far below every backend's limit on bound parameters


class StabilityRecordStore:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def add(self, rows: Sequence[StabilityRecordRow], max_session_tokens: int) -> int:
        """Store `rows` (of one session; a sequence id already stored is kept as it is: a resent sample), then
        evict that session's least recently used other records while its tokens exceed `max_session_tokens`.
        Returns how many were evicted."""
        if not rows:
            return 0
        session_id = rows[0].session_id
        new_ids = [row.sequence_id for row in rows]
        with self._sessions.begin() as db:
            known = set(_in_chunks(db, select(StabilityRecordRow.sequence_id), new_ids))
            db.add_all(row for row in rows if row.sequence_id not in known)
            db.flush()
            total = db.scalar(select(func.coalesce(func.sum(StabilityRecordRow.num_tokens), 0))
                              .where(StabilityRecordRow.session_id == session_id)) or 0
            if total <= max_session_tokens:
                return 0
            oldest = db.execute(
                select(StabilityRecordRow.sequence_id, StabilityRecordRow.num_tokens)
                .where(StabilityRecordRow.session_id == session_id, StabilityRecordRow.sequence_id.not_in(new_ids))
                .order_by(StabilityRecordRow.last_used_at, StabilityRecordRow.created_at)
            )
            evict: list[str] = []
            for sequence_id, num_tokens in oldest:
                if total <= max_session_tokens:
                    break
                evict.append(sequence_id)
                total -= num_tokens
            for start in range(0, len(evict), _CHUNK):
                chunk = evict[start:start + _CHUNK]
                db.execute(delete(StabilityRecordRow).where(StabilityRecordRow.sequence_id.in_(chunk)))
            return len(evict)

    def get(self, owner: str, sequence_ids: Iterable[str]) -> list[StabilityRecordRow]:
        """The owner's records among `sequence_ids` (others' and unknown ids are simply not returned)."""
        query = select(StabilityRecordRow).where(StabilityRecordRow.owner == owner)
        with self._sessions.begin() as db:
            return list(_in_chunks(db, query, list(sequence_ids)))

    def touch(self, owner: str, sequence_ids: Iterable[str], now: datetime) -> None:
        ids = list(sequence_ids)
        with self._sessions.begin() as db:
            for start in range(0, len(ids), _CHUNK):
                db.execute(update(StabilityRecordRow)
                           .where(StabilityRecordRow.owner == owner,
                                  StabilityRecordRow.sequence_id.in_(ids[start:start + _CHUNK]))
                           .values(last_used_at=now))

    def tokens_of_session(self, session_id: str) -> int:
        with self._sessions.begin() as db:
            return int(db.scalar(select(func.coalesce(func.sum(StabilityRecordRow.num_tokens), 0))
                                 .where(StabilityRecordRow.session_id == session_id)) or 0)

    def delete_session(self, session_id: str) -> int:
        with self._sessions.begin() as db:
            doomed = delete(StabilityRecordRow).where(StabilityRecordRow.session_id == session_id)
            return deleted_count(db.execute(doomed))

    def delete_unused_since(self, cutoff: datetime) -> int:
        """Delete the records last used before `cutoff`; returns how many."""
        with self._sessions.begin() as db:
            doomed = delete(StabilityRecordRow).where(StabilityRecordRow.last_used_at < cutoff)
            return deleted_count(db.execute(doomed))


def _in_chunks(db: Session, query, ids: list[str]) -> Iterator:
    for start in range(0, len(ids), _CHUNK):
        yield from db.scalars(query.where(StabilityRecordRow.sequence_id.in_(ids[start:start + _CHUNK])))


def deleted_count(result: object) -> int:
    """The rows a DELETE removed (its result is a cursor's)."""
    return result.rowcount if isinstance(result, CursorResult) else 0
