"""The audit log stays bounded (tx/core/audit.py): the janitor's prune keeps the newest entries, none older than
the retention, and a reader sees only their own entries of one day."""

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
        assert audit.prune() == 20
        kept = audit.day("x", True, today, "all")
        assert [e.run_id for e in kept] == [f"r{i}" for i in range(20, 30)]
        assert audit.day("alice", False, today, "keys") == []
        audit.retention_s = 0
        assert audit.prune() == 10 and audit.day("x", True, today, "all") == []
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
