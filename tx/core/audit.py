"""The audit log: who did what to which run, checkpoint and key.

Events are named `<resource>_<action>`: `run_create`; `checkpoint_save`, `checkpoint_read` (with its purpose:
load, sample or download), `checkpoint_copy`, `checkpoint_publish`, `checkpoint_unpublish`,
`checkpoint_ttl_set`, `checkpoint_delete`, `checkpoint_expire`; `key_token_issue` (a token exchanged for a key).
Each names its actor (a key's owner, `tx:key:<owner>`; the server itself is `tx`) and the owner of what it
concerns. An owner reads the entries they are actor or subject of, with every other key's owner shown as a
pseudonym of their own (`other-<hash>`, one per reader and key) and without that key's own paths (a copy's); an
operator reads every entry as it is.

The log is bounded per tenant, so no key's activity pushes out another's: the janitor drops entries older than
`retention_s`, and keeps an entry while it is among the newest `max_entries` its actor or its subject owner may
read. Token exchanges are folded into one entry per key per UTC hour (`count`, `last_at`). Recording never
fails the call it records: a store error there is logged and the entry lost.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass, field, replace
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from tx.store.store import Store
from tx.store.tables import AuditRow, utcnow

logger = logging.getLogger(__name__)
SERVER = "tx"  # the actor of what the server does by itself (expiry)
MAX_ENTRIES_PER_READ = 10_000
EVENT_TYPES: dict[str, tuple[str, ...] | None] = {  # the SDK's event_type -> the event prefixes it covers
    "all": None, "checkpoints": ("checkpoint_",), "runs": ("run_",), "keys": ("key_",),
    "projects": (), "teams": (), "organizations": (),  # tx has no projects to grant, teams or organisations
}
HOURLY = frozenset({"key_token_issue"})  # events folded into one entry per actor per UTC hour
ACTORS_OWN = ("copy",)  # details that name the actor's own resources, shown to no other key


@dataclass(frozen=True)
class AuditEntry:
    at: datetime
    event: str
    actor: str
    subject_owner: str | None
    run_id: str | None
    tinker_path: str | None
    details: dict[str, Any] = field(default_factory=dict)


def urn(owner: str) -> str:
    return SERVER if owner == SERVER else f"tx:key:{owner}"


class AuditTrail:
    def __init__(self, store: Store, max_entries: int = 100_000, retention_s: float = 90 * 86400) -> None:
        self.store = store
        self.max_entries = max_entries
        self.retention_s = retention_s
        self._folding = threading.Lock()  # one hour's entry per actor, however many exchanges race

    def record(self, event: str, actor: str, *, subject_owner: str | None = None, run_id: str | None = None,
               tinker_path: str | None = None, **details: Any) -> None:
        row = AuditRow(at=utcnow(), event=event, actor=actor, subject_owner=subject_owner or actor,
                       run_id=run_id, tinker_path=tinker_path, details=details)
        try:
            if event in HOURLY:
                with self._folding:
                    self.store.audit.fold(row, row.at.replace(minute=0, second=0, microsecond=0))
            else:
                self.store.audit.add(row)
        except Exception:  # noqa: BLE001 - an audit entry never fails the call it records
            logger.exception("audit entry lost: %s by %s on %s", event, actor, tinker_path or run_id)

    def day(self, reader: str, operator: bool, day: date, event_type: str) -> list[AuditEntry]:
        """The entries of one UTC day that `reader` may read, oldest first (at most MAX_ENTRIES_PER_READ)."""
        prefixes = EVENT_TYPES[event_type]
        if prefixes == () or day > utcnow().date():  # a day to come has no entries (and date.max no next day)
            return []
        start = datetime.combine(day, time(), tzinfo=timezone.utc)
        rows = self.store.audit.between(start, start + timedelta(days=1), None if operator else reader,
                                        prefixes, MAX_ENTRIES_PER_READ)
        entries = [AuditEntry(_aware(r.at), r.event, r.actor, r.subject_owner, r.run_id, r.tinker_path,
                              r.details or {}) for r in rows]
        return entries if operator else [_as_seen_by(reader, e) for e in entries]

    def prune(self) -> int:
        return self.store.audit.prune(utcnow() - timedelta(seconds=self.retention_s), self.max_entries)


def _as_seen_by(reader: str, entry: AuditEntry) -> AuditEntry:
    """`entry` as a tenant may see it: another key's owner as a pseudonym, none of that key's own paths."""
    details = entry.details if entry.actor in (reader, SERVER) else \
        {k: v for k, v in entry.details.items() if k not in ACTORS_OWN}
    return replace(entry, actor=_seen(reader, entry.actor), details=details,
                   subject_owner=None if entry.subject_owner is None else _seen(reader, entry.subject_owner))


def _seen(reader: str, owner: str) -> str:
    """`owner` as `reader` sees it: themselves and the server as they are, another key as `other-<hash>`, stable for
    this reader (to tell readers apart) and different for each reader (so tenants cannot match theirs up)."""
    if owner in (reader, SERVER):
        return owner
    return "other-" + hashlib.sha256(f"{reader}:{owner}".encode()).hexdigest()[:16]


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
