"""Stability records: every sequence sampled with `record_stability_info=True` is recorded under the
`sequence_id` its sample call returned, for `stable_reinforce` training to read back through the datums'
provenance spans (the formula that reads them: `tx/backends/losses.py`).

- A record holds the sampled tokens, the sampler's logprob of each, the prompt's length, the base model and
  the weights version that sampled it. It lives in the store, so it survives a restart of the server.
- It belongs to the session that sampled it: a training request of another session gets a 400 naming it, one
  of another key a 400 that does not tell it exists.
- It can be trained on for one day after it was sampled; each training request that uses it restarts its day.
  The janitor deletes records unused for a day, and a session's records when the session finishes.
- A session holds at most `max_session_tokens` recorded tokens (default 2^24 = 16,777,216, about 128 MiB of
  tokens and logprobs). Past it, its least recently used records are evicted to make room (new samples are
  always recorded); a training request naming an evicted record gets the same 400 as one naming a record never
  made, which says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone

import numpy as np

from tx.store.store import Store
from tx.store.tables import StabilityRecordRow
from tx.types import SampledSequence, StabilityRecord, UserError

logger = logging.getLogger(__name__)

RECORD_DAY = timedelta(days=1)
MAX_SESSION_TOKENS = 1 << 24
_NAMED = 3  # ids an error names before it counts the rest


class StabilityRecords:
    def __init__(self, store: Store, max_session_tokens: int = MAX_SESSION_TOKENS,
                 lifetime: timedelta = RECORD_DAY) -> None:
        self.store = store
        self.max_session_tokens = max_session_tokens
        self.lifetime = lifetime

    def record(self, owner: str, session_id: str, sampler_id: str, base_model: str, weights_version: int | None,
               prompt_length: int, sequence_ids: Sequence[str], sequences: Sequence[SampledSequence]) -> None:
        """Record one sample call's sequences (a resent call's are already there and stay as they were)."""
        now = _now()
        rows = [
            StabilityRecordRow(
                sequence_id=sequence_id, session_id=session_id, owner=owner, sampler_id=sampler_id,
                base_model=base_model, weights_version=weights_version, prompt_length=prompt_length,
                num_tokens=len(seq.tokens), tokens=np.asarray(seq.tokens, dtype="<i4").tobytes(),
                logprobs=np.asarray(seq.logprobs, dtype="<f4").tobytes(), created_at=now, last_used_at=now,
            )
            for sequence_id, seq in zip(sequence_ids, sequences, strict=True)
        ]
        evicted = self.store.stability.add(rows, self.max_session_tokens)
        if evicted:
            logger.warning("session %s holds over %d recorded tokens: evicted its %d least recently used records",
                           session_id, self.max_session_tokens, evicted)

    def resolve(self, owner: str, session_id: str, sequence_ids: Iterable[str]) -> dict[str, StabilityRecord]:
        """The records a training request of `session_id` names; a UserError naming every id it may not use:
        unknown (never recorded, evicted, or another key's), expired, or sampled in another session."""
        wanted = sorted(set(sequence_ids))
        rows = {row.sequence_id: row for row in self.store.stability.get(owner, wanted)}
        cutoff = _now() - self.lifetime
        missing = [i for i in wanted if i not in rows]
        foreign = [i for i, row in rows.items() if row.session_id != session_id]
        expired = [i for i, row in rows.items() if row.session_id == session_id and _aware(row.last_used_at) <= cutoff]
        problems = []
        if missing:
            problems.append(
                f"no stability record of sequence_id {_names(missing)}: sample with record_stability_info=True in "
                f"this session (records older than a day unused, and a session's least recently used records past "
                f"{self.max_session_tokens:,} recorded tokens, are deleted)")
        if expired:
            problems.append(f"the stability record of sequence_id {_names(expired)} expired: a record can be "
                            "trained on for one day after its sampling or its last use in training")
        if foreign:
            problems.append(f"sequence_id {_names(foreign)} was sampled in another session: a training request "
                            "can only name sequences sampled in its own session")
        if problems:
            raise UserError("; ".join(problems))
        return {i: _domain(row) for i, row in rows.items()}

    def touch(self, owner: str, sequence_ids: Iterable[str]) -> None:
        """A training request used these records: their day starts again."""
        self.store.stability.touch(owner, sorted(set(sequence_ids)), _now())

    def forget_session(self, owner: str, session_id: str) -> None:
        """The session finished: no training request can name its records any more."""
        self.store.stability.delete_session(session_id)

    def delete_expired(self) -> int:
        return self.store.stability.delete_unused_since(_now() - self.lifetime)


def _domain(row: StabilityRecordRow) -> StabilityRecord:
    return StabilityRecord(
        sequence_id=row.sequence_id, base_model=row.base_model, weights_version=row.weights_version,
        prompt_length=row.prompt_length, tokens=np.frombuffer(row.tokens, dtype="<i4").astype(np.int64),
        logprobs=np.frombuffer(row.logprobs, dtype="<f4").astype(np.float32),
    )


def _names(ids: list[str]) -> str:
    named = ", ".join(repr(i) for i in ids[:_NAMED])
    return named if len(ids) <= _NAMED else f"{named} (and {len(ids) - _NAMED} more)"


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _aware(value: datetime) -> datetime:
    """SQLite hands datetimes back without a zone; every time tx stores is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
