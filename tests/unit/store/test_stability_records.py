"""Stability records (tx/core/sampling/records.py) over a real store: recorded per session, read back only by
that session (another key's look absent), a day of life restarted by each use, evicted least recently used past
the per-session cap, deleted with their session."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from sqlalchemy import update

from tx.core.sampling.records import StabilityRecords
from tx.store.store import Store
from tx.store.tables import SessionRow, StabilityRecordRow
from tx.types import SampledSequence, StopReason, UserError


def _session(store: Store, owner: str = "alice") -> str:
    sid = uuid.uuid4().hex
    store.create_session(SessionRow(session_id=sid, owner=owner, sdk_version="0.38.0", tags=[], user_metadata={}))
    return sid


def _sample(records: StabilityRecords, sid: str, call: int, lengths: list[int], owner: str = "alice") -> list[str]:
    """One recorded sample call of `sid`: a sequence of each length; returns their ids."""
    ids = [f"{sid}:sample:0:{call}:{i}" for i in range(len(lengths))]
    seqs = [SampledSequence(list(range(1, n + 1)), [-0.5 * (k + 1) for k in range(n)], StopReason.LENGTH)
            for n in lengths]
    records.record(owner, sid, f"{sid}:sample:0", "base", 3, 5, ids, seqs)
    return ids


def _age(store: Store, sequence_ids: list[str], by: timedelta) -> None:
    with store._sessions.begin() as db:
        db.execute(update(StabilityRecordRow).where(StabilityRecordRow.sequence_id.in_(sequence_ids))
                   .values(last_used_at=datetime.now(timezone.utc) - by))


def test_a_record_reads_back_exactly_in_its_own_session_only(store: Store) -> None:
    records = StabilityRecords(store)
    sid, other = _session(store), _session(store)
    ids = _sample(records, sid, 1, [3, 2])
    got = records.resolve("alice", sid, ids)
    assert got[ids[0]].tokens.tolist() == [1, 2, 3] and got[ids[1]].tokens.dtype == np.int64
    assert got[ids[0]].logprobs.tolist() == [-0.5, -1.0, -1.5] and got[ids[0]].logprobs.dtype == np.float32
    assert (got[ids[0]].prompt_length, got[ids[0]].weights_version, got[ids[0]].base_model) == (5, 3, "base")
    _sample(records, sid, 1, [7, 7])  # a resent call keeps what was recorded first
    assert records.resolve("alice", sid, ids[:1])[ids[0]].tokens.tolist() == [1, 2, 3]
    with pytest.raises(UserError, match=f"sequence_id '{ids[0]}'.* was sampled in another session"):
        records.resolve("alice", other, ids)
    with pytest.raises(UserError, match=f"no stability record of sequence_id '{ids[0]}'"):  # no leak to bob
        records.resolve("bob", sid, ids)
    with pytest.raises(UserError, match=r"'x:1', 'x:2', 'x:3' \(and 1 more\)"):
        records.resolve("alice", sid, ["x:1", "x:2", "x:3", "x:4", ids[0]])


def test_a_record_lives_a_day_from_its_last_use(store: Store) -> None:
    records = StabilityRecords(store)
    sid = _session(store)
    used, unused = _sample(records, sid, 1, [2]), _sample(records, sid, 2, [2])
    _age(store, used + unused, timedelta(hours=23))
    records.touch("alice", used)  # a training request used it: its day starts again
    _age(store, unused, timedelta(hours=24, seconds=1))
    records.resolve("alice", sid, used)
    with pytest.raises(UserError, match=f"record of sequence_id '{unused[0]}' expired"):
        records.resolve("alice", sid, used + unused)
    assert records.delete_expired() >= 1  # (a shared PostgreSQL may hold others)
    with pytest.raises(UserError, match="no stability record"):
        records.resolve("alice", sid, unused)


def test_past_the_cap_the_least_recently_used_records_are_evicted(store: Store) -> None:
    records = StabilityRecords(store, max_session_tokens=10)
    sid, other = _session(store), _session(store)
    first, second = _sample(records, sid, 1, [4]), _sample(records, sid, 2, [4])
    _sample(records, other, 1, [8])  # another session's records count against its own cap
    _age(store, first + second, timedelta(minutes=5))
    records.touch("alice", first)  # used after the second: the second is now the least recently used
    third = _sample(records, sid, 3, [4])
    assert store.stability.tokens_of_session(sid) == 8
    records.resolve("alice", sid, first + third)
    with pytest.raises(UserError, match=f"'{second[0]}'.*least recently used records past 10 recorded tokens"):
        records.resolve("alice", sid, second)
    big = _sample(records, sid, 4, [12])  # new samples are always recorded, alone over the cap if need be
    assert records.resolve("alice", sid, big) and store.stability.tokens_of_session(sid) == 12


def test_a_finished_session_forgets_its_records(store: Store) -> None:
    records = StabilityRecords(store)
    sid, other = _session(store), _session(store)
    ids, kept = _sample(records, sid, 1, [2]), _sample(records, other, 1, [2])
    records.forget_session("alice", sid)
    with pytest.raises(UserError, match="no stability record"):
        records.resolve("alice", sid, ids)
    records.resolve("alice", other, kept)
