"""The audit log stays bounded (tx/core/audit.py): the janitor's prune keeps each tenant's newest entries, none
older than the retention, token exchanges fold into one entry an hour, and a reader sees only their own entries of
one day, with other keys as pseudonyms."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from pathlib import Path

from tx.core.audit import AuditTrail
from tx.store.store import Store


def test_prune_keeps_the_newest_within_the_retention(tmp_path: Path) -> None:
    store = Store.from_url(f"sqlite:///{tmp_path / 'tx.db'}")
    try:
        audit = AuditTrail(store, max_entries=10, retention_s=3600)
        for i in range(30):
            audit.record("run_create", "alice" if i % 2 else "bob", run_id=f"r{i}")
        today = datetime.now(timezone.utc).date()
        assert len(audit.day("alice", False, today, "all")) == 15
        assert audit.prune() == 10  # each tenant keeps its newest 10
        kept = audit.day("x", True, today, "all")
        assert [e.run_id for e in kept] == [f"r{i}" for i in range(10, 30)]
        assert audit.day("alice", False, today, "keys") == []
        audit.retention_s = 0
        assert audit.prune() == 20 and audit.day("x", True, today, "all") == []
        assert audit.day("x", True, today - timedelta(days=1), "all") == []
    finally:
        store.close()


def test_a_day_to_come_has_no_entries(tmp_path: Path) -> None:
    """`GET /api/v1/audit?day=9999-12-31` was a 500: the day's end overflowed the calendar (issue 38)."""
    store = Store.from_url(f"sqlite:///{tmp_path / 'tx.db'}")
    try:
        audit = AuditTrail(store, max_entries=10, retention_s=3600)
        audit.record("run_create", "alice", run_id="r0")
        tomorrow = datetime.now(timezone.utc).date() + timedelta(days=1)
        assert audit.day("alice", False, date.max, "all") == audit.day("alice", True, tomorrow, "all") == []
        assert audit.day("alice", False, date.min, "all") == []
    finally:
        store.close()


def test_one_tenants_entries_never_push_out_anothers(tmp_path: Path) -> None:
    """Issue 38 item 3: with a global cap of the newest N, one key's 2,100 token exchanges made the next prune
    drop every other key's entries (who read a published checkpoint included). Each tenant keeps its own newest N,
    and an entry about two tenants stays while either keeps it."""
    store = Store.from_url(f"sqlite:///{tmp_path / 'tx.db'}")
    try:
        audit = AuditTrail(store, max_entries=5, retention_s=3600)
        audit.record("checkpoint_save", "alice", run_id="a", tinker_path="tinker://a/sampler_weights/s")
        audit.record("checkpoint_read", "bob", subject_owner="alice", run_id="a", purpose="sample")
        for i in range(50):
            audit.record("checkpoint_ttl_set", "bob", run_id=f"b{i}")
        audit.prune()
        today = datetime.now(timezone.utc).date()
        assert [e.event for e in audit.day("alice", False, today, "all")] == ["checkpoint_save", "checkpoint_read"]
        assert [e.run_id for e in audit.day("bob", False, today, "all")] == ["a"] + [f"b{i}" for i in range(45, 50)]
    finally:
        store.close()


def test_token_exchanges_fold_into_one_entry_an_hour(tmp_path: Path) -> None:
    store = Store.from_url(f"sqlite:///{tmp_path / 'tx.db'}")
    try:
        audit = AuditTrail(store, max_entries=5, retention_s=3600)
        audit.record("run_create", "alice", run_id="a")
        for _ in range(300):
            audit.record("key_token_issue", "bob", ttl_seconds=900)
        audit.record("key_token_issue", "alice", ttl_seconds=900)
        today = datetime.now(timezone.utc).date()
        bobs = [e for e in audit.day("x", True, today, "keys") if e.actor == "bob"]
        assert sum(e.details.get("count", 1) for e in bobs) == 300  # one entry, or two if an hour began meanwhile
        assert len(bobs) <= 2 and bobs[-1].details["ttl_seconds"] == 900 and "last_at" in bobs[-1].details
        assert [e.event for e in audit.day("alice", False, today, "all")] == ["run_create", "key_token_issue"]
    finally:
        store.close()


def test_a_tenant_sees_other_keys_as_pseudonyms(tmp_path: Path) -> None:
    """Issue 38 item 8c: Alice's entries about Bob's reads and copies of her published checkpoint named Bob's owner
    id and the copy's path (his session id); an operator still sees them."""
    store = Store.from_url(f"sqlite:///{tmp_path / 'tx.db'}")
    try:
        audit = AuditTrail(store, max_entries=50, retention_s=3600)
        for reader in ("bob", "carol", "bob"):
            audit.record("checkpoint_copy", reader, subject_owner="alice", run_id="a",
                         tinker_path="tinker://a/sampler_weights/s", copy=f"tinker://{reader}-session:train:0/x")
        today = datetime.now(timezone.utc).date()
        seen = audit.day("alice", False, today, "all")
        assert {e.subject_owner for e in seen} == {"alice"}
        bob, carol, bob_again = (e.actor for e in seen)
        assert bob == bob_again != carol and bob.startswith("other-") and "bob" not in bob
        assert all("copy" not in e.details and "session" not in str(e) for e in seen)
        assert audit.day("carol", False, today, "all")[0].details["copy"] == "tinker://carol-session:train:0/x"
        assert audit.day("carol", False, today, "all")[0].subject_owner.startswith("other-")
        assert [e.actor for e in audit.day("x", True, today, "all")] == ["bob", "carol", "bob"]
    finally:
        store.close()
