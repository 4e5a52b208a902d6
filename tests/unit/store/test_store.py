"""The store on SQLite, and on PostgreSQL when TX_TEST_POSTGRES_URL points at one."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from tx.store.store import SessionFinishedError, Store
from tx.store.tables import CheckpointRow, SessionRow, TrainingRunRow
from tx.types import ConflictError, NotFoundError


def _session(store: Store, owner: str = "alice") -> str:
    sid = uuid.uuid4().hex
    store.create_session(SessionRow(session_id=sid, owner=owner, sdk_version="0.38.0", tags=[], user_metadata={}))
    return sid


def _run(store: Store, sid: str, owner: str = "alice") -> str:
    run_id = f"{sid}:train:0"
    store.create_run(TrainingRunRow(run_id=run_id, session_id=sid, owner=owner, base_model="m", lora_rank=4,
                                    lora_config={"rank": 4}, user_metadata={"k": "v"}))
    return run_id


def test_sessions_heartbeat_and_finish(store: Store) -> None:
    sid = _session(store)
    store.heartbeat(sid, "alice")
    store.finish_session(sid, "alice", "success")
    store.finish_session(sid, "alice", "errored")  # first finish wins
    assert store.get_session(sid, "alice").finish_reason == "success"
    with pytest.raises(SessionFinishedError):
        store.heartbeat(sid, "alice")
    with pytest.raises(NotFoundError):
        store.heartbeat(sid, "bob")


def test_runs_are_owned_and_listed(store: Store) -> None:
    sid = _session(store)
    run_id = _run(store, sid)
    assert store.get_run(run_id, "alice").lora_config == {"rank": 4}
    with pytest.raises(NotFoundError):
        store.get_run(run_id, "bob")
    with pytest.raises(ConflictError):
        _run(store, sid)
    runs, total = store.list_runs("alice", 10, 0)
    assert run_id in [r.run_id for r in runs] and total >= 1


def test_checkpoints_overwrite_delete_and_expire(store: Store) -> None:
    owner = uuid.uuid4().hex  # its own owner: a PostgreSQL database outlives one run of the tests
    run_id = _run(store, _session(store, owner), owner)
    now = datetime.now(timezone.utc)
    row = lambda name, expires=None: CheckpointRow(  # noqa: E731
        run_id=run_id, checkpoint_id=f"weights/{name}", kind="weights", owner=owner, size_bytes=10,
        created_at=now, expires_at=expires,
    )
    store.add_checkpoint(row("a"), overwrite=False)
    with pytest.raises(ConflictError):
        store.add_checkpoint(row("a"), overwrite=False)
    store.add_checkpoint(row("a"), overwrite=True)
    store.add_checkpoint(row("old", now - timedelta(seconds=5)), overwrite=False)
    assert [c.checkpoint_id for c in store.expired_checkpoints(now) if c.run_id == run_id] == ["weights/old"]
    # an expired checkpoint is gone from lists and reads before the sweeper deletes it
    assert [c.checkpoint_id for c in store.list_checkpoints(run_id, owner)] == ["weights/a"]
    assert store.list_user_checkpoints(owner, 10, 0)[1] == 1
    with pytest.raises(NotFoundError):
        store.get_checkpoint(run_id, "weights/old", owner)
    store.delete_checkpoint(run_id, "weights/a", owner)
    with pytest.raises(NotFoundError):
        store.get_checkpoint(run_id, "weights/a", owner)


def test_latest_checkpoints_of_many_runs_in_one_query(store: Store) -> None:
    runs = [_run(store, _session(store)) for _ in range(3)]
    start = datetime.now(timezone.utc)
    for i, run_id in enumerate(runs[:2]):
        for step in range(3):
            for kind in ("weights", "sampler_weights"):
                store.add_checkpoint(CheckpointRow(
                    run_id=run_id, checkpoint_id=f"{kind}/{step}", kind=kind, owner="alice", size_bytes=1,
                    created_at=start + timedelta(seconds=step + i),
                ), overwrite=False)
    latest = store.latest_checkpoints(runs, ("weights", "sampler_weights"))
    assert {key: row.checkpoint_id for key, row in latest.items()} == {
        (run, kind): f"{kind}/2" for run in runs[:2] for kind in ("weights", "sampler_weights")
    }
    assert store.latest_checkpoints(runs[2:], ("weights",)) == {} == store.latest_checkpoints([], ("weights",))


def test_published_checkpoints_are_readable_by_any_key_only_where_asked(store: Store) -> None:
    run_id = _run(store, _session(store))
    store.add_checkpoint(CheckpointRow(run_id=run_id, checkpoint_id="weights/p", kind="weights", owner="alice",
                                       size_bytes=1), overwrite=False)
    with pytest.raises(NotFoundError):
        store.get_checkpoint(run_id, "weights/p", "bob", public_ok=True)
    with pytest.raises(NotFoundError):  # only the owner publishes
        store.update_checkpoint(run_id, "weights/p", "bob", public=True)
    store.update_checkpoint(run_id, "weights/p", "alice", public=True)
    assert store.get_checkpoint(run_id, "weights/p", "bob", public_ok=True).public
    with pytest.raises(NotFoundError):  # reads that do not load or sample stay the owner's
        store.get_checkpoint(run_id, "weights/p", "bob")
    store.update_checkpoint(run_id, "weights/p", "alice", public=False)
    with pytest.raises(NotFoundError):
        store.get_checkpoint(run_id, "weights/p", "bob", public_ok=True)


def test_user_checkpoints_page_newest_first(store: Store) -> None:
    owner = uuid.uuid4().hex
    run_id = _run(store, _session(store, owner), owner)
    start = datetime.now(timezone.utc)
    for i in range(5):
        store.add_checkpoint(CheckpointRow(run_id=run_id, checkpoint_id=f"weights/{i}", kind="weights", owner=owner,
                                           size_bytes=1, created_at=start + timedelta(seconds=i)), overwrite=False)
    pages = [store.list_user_checkpoints(owner, 2, offset) for offset in (0, 2, 4)]
    assert [[r.checkpoint_id for r in rows] for rows, _ in pages] == [
        ["weights/4", "weights/3"], ["weights/2", "weights/1"], ["weights/0"]]
    assert {total for _, total in pages} == {5}


def test_sessions_page_by_cursor_newest_first(store: Store) -> None:
    owner = uuid.uuid4().hex
    ids = [_session(store, owner) for _ in range(3)]
    first = store.sessions_before(owner, None, None, 2)
    rest = store.sessions_before(owner, None, (first[-1].created_at, first[-1].session_id), 2)
    assert sorted(r.session_id for r in first + rest) == sorted(ids) and len(rest) == 1
    store.set_session_project(ids[0], owner, "p1")
    assert [r.session_id for r in store.sessions_before(owner, ["p1"], None, 5)] == [ids[0]]


def test_columns_added_by_newer_tx_are_added_to_an_old_database(tmp_path) -> None:
    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = create_engine(url)
    with old.begin() as conn:  # the checkpoints table as tx made it before `public` existed
        conn.execute(text("CREATE TABLE checkpoints (run_id VARCHAR(128) NOT NULL, checkpoint_id VARCHAR(300) "
                          "NOT NULL, kind VARCHAR(32), owner VARCHAR(64), size_bytes BIGINT, created_at DATETIME, "
                          "expires_at DATETIME, user_metadata JSON, PRIMARY KEY (run_id, checkpoint_id))"))
    old.dispose()
    store = Store.from_url(url)
    sid = _session(store)
    run_id = _run(store, sid)
    store.add_checkpoint(CheckpointRow(run_id=run_id, checkpoint_id="weights/x", kind="weights", owner="alice",
                                       size_bytes=1), overwrite=False)
    store.update_checkpoint(run_id, "weights/x", "alice", public=True)
    assert store.get_checkpoint(run_id, "weights/x", "zed", public_ok=True).public
    store.close()


def test_a_runs_metrics_read_back_decoded_in_order(store: Store) -> None:
    """The console's curves: `since` reads the metrics as text and decodes them all at once (on SQLite and
    PostgreSQL alike), each row its own dict."""
    from tx.store.tables import RunMetricRow

    run_id = _run(store, _session(store))
    rows = [RunMetricRow(run_id=run_id, seq=i, step=i, kind="forward_backward", finished=float(i), seconds=0.5,
                         tokens=10, total_tokens=10 * i, metrics={"loss:sum": 1.0 / i, "note": i})
            for i in range(1, 6)]
    store.metrics.add(rows)
    points = store.metrics.since(run_id, 2, 10)
    assert [p.seq for p in points] == [3, 4, 5]
    assert [p.metrics for p in points] == [{"loss:sum": 1.0 / i, "note": i} for i in (3, 4, 5)]
    assert points[0][:7] == (3, 3, "forward_backward", 3.0, 0.5, 10, 30)
