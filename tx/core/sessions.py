"""Sessions: create, heartbeat, finish (by the client, or by the janitor when heartbeats stop), and the reads:
get, list, search, assign a project, export a trace.

A session belongs to the key that created it; every read takes the caller and answers 404 for
someone else's. tx has no organisations, so every search (owner "own", "accessible" or "user")
covers the caller's own sessions. Finishing a session frees its models, custom losses and stability records;
its runs and checkpoints stay.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from tx.core import quotas
from tx.core.checkpoints.downloads import DownloadSigner, LinkScope
from tx.core.futures import FutureRegistry
from tx.core.quotas import QuotaLimits
from tx.core.timeline import chrome_trace
from tx.store.store import Store
from tx.store.tables import SessionRow
from tx.types import UserError

logger = logging.getLogger(__name__)

DEFAULT_PROJECT = "default"


@dataclass(frozen=True)
class SessionStatus:
    """active | client_finished (with the client's reason: success, errored, interrupted) |
    cancelled (tx finished it: no heartbeat)."""

    type: str
    reason: str | None = None


@dataclass(frozen=True)
class SessionView:
    session_id: str
    owner: str
    created_at: datetime
    project_id: str
    display_name: str | None
    user_metadata: dict[str, str]
    status: SessionStatus
    checkpoints_count: int = 0
    checkpoint_bytes: int = 0


@dataclass(frozen=True)
class SessionContents:
    session: SessionView
    training_run_ids: list[str]
    sampler_ids: list[str]


@dataclass(frozen=True)
class SessionQuery:
    """Search filters (all must hold; `session_id` or `display_name` match either one)."""

    session_id: str | None = None
    display_name: str | None = None
    project_ids: list[str] | None = None
    user_metadata: dict[str, str] = field(default_factory=dict)
    statuses: list[SessionStatus] | None = None  # reason None: any reason
    limit: int = 50
    after: tuple[datetime, str] | None = None  # (created_at, session_id) of the last one seen


def live_session(store: Store, session_id: str, owner: str) -> SessionRow:
    """The caller's session, if it is not finished; a UserError telling the client to start a new one."""
    row = store.get_session(session_id, owner)
    if row.finished_at is not None:
        raise UserError(f"session {session_id!r} is finished; start a new ServiceClient")
    return row


class SessionEnd(Protocol):
    """What else a finished session frees (its models; its custom losses; its stability records)."""

    def forget_session(self, owner: str, session_id: str) -> None: ...


class SessionService:
    def __init__(self, store: Store, futures: FutureRegistry, signer: DownloadSigner,
                 on_finish: list[SessionEnd] | None = None, limits: QuotaLimits | None = None) -> None:
        self.store = store
        self.futures = futures
        self.signer = signer
        self._on_finish = on_finish or []
        self.limits = limits or QuotaLimits()
        self._creating = threading.Lock()  # a key's quota check and its insert, one at a time

    # -- writes -----------------------------------------------------------------------------
    def create(self, owner: str, sdk_version: str | None, tags: list[str], user_metadata: dict[str, Any],
               project_id: str | None = None, display_name: str | None = None) -> str:
        session_id = uuid.uuid4().hex
        with self._creating:
            quotas.check("sessions", self.store.open_sessions(owner), 1, self.limits.sessions)
            self.store.create_session(SessionRow(
                session_id=session_id, owner=owner, sdk_version=sdk_version, tags=tags, user_metadata=user_metadata,
                project_id=project_id, display_name=display_name,
            ))
        return session_id

    def heartbeat(self, owner: str, session_id: str) -> None:
        self.store.heartbeat(session_id, owner)

    def finish(self, owner: str, session_id: str, reason: str) -> None:
        self.store.finish_session(session_id, owner, reason)
        for part in self._on_finish:
            part.forget_session(owner, session_id)

    def reap_stale(self, timeout_s: float) -> int:
        """Finish sessions that stopped heartbeating (a crashed client), freeing their models."""
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=timeout_s)
        stale = self.store.stale_sessions(cutoff)
        for row in stale:
            logger.warning("session %s sent no heartbeat for %.0f s; finishing it", row.session_id, timeout_s)
            self.finish(row.owner, row.session_id, "timeout")
        return len(stale)

    # -- reads ------------------------------------------------------------------------------

    def get(self, owner: str, session_id: str) -> SessionContents:
        row, runs, samplers = self.store.session_contents(session_id, owner)
        return SessionContents(view(row), runs, samplers)

    def list_ids(self, owner: str, limit: int, offset: int) -> list[str]:
        return self.store.list_sessions(owner, limit, offset)

    def assign_project(self, owner: str, session_id: str, project_id: str) -> None:
        self.store.set_session_project(session_id, owner, project_id)

    def search(self, owner: str, query: SessionQuery) -> tuple[list[SessionView], tuple[datetime, str] | None]:
        """One page, newest first, and the cursor of the next page (None at the end)."""
        found: list[SessionView] = []
        after = query.after
        while len(found) <= query.limit:
            rows = self.store.sessions_before(owner, query.project_ids, after, 500)
            found += [view(r) for r in rows if _matches(r, query)]
            if len(rows) < 500:
                break
            after = (rows[-1].created_at, rows[-1].session_id)
        page, more = found[: query.limit], len(found) > query.limit
        totals = self.store.checkpoint_totals([v.session_id for v in page])
        page = [_with_totals(v, totals.get(v.session_id, (0, 0))) for v in page]
        return page, ((page[-1].created_at, page[-1].session_id) if more else None)

    # -- trace ------------------------------------------------------------------------------
    def trace_link(self, owner: str, session_id: str) -> str:
        """A signed link to the session's trace (checks the session is the caller's)."""
        self.store.get_session(session_id, owner)
        token, _ = self.signer.sign(LinkScope(kind="trace", owner=owner, session_id=session_id))
        return token

    def trace_json(self, owner: str, session_id: str) -> bytes:
        self.store.get_session(session_id, owner)
        return json.dumps(chrome_trace(session_id, self.futures.timeline.spans(session_id))).encode()


def view(row: SessionRow) -> SessionView:
    return SessionView(
        session_id=row.session_id, owner=row.owner, created_at=_utc(row.created_at),
        project_id=row.project_id or DEFAULT_PROJECT, display_name=row.display_name,
        user_metadata={str(k): str(v) for k, v in (row.user_metadata or {}).items()},
        status=session_status(row),
    )


def session_status(row: SessionRow) -> SessionStatus:
    if row.finished_at is None:
        return SessionStatus("active")
    if row.finish_reason in ("success", "errored", "interrupted"):
        return SessionStatus("client_finished", row.finish_reason)
    return SessionStatus("cancelled", row.finish_reason)


def _matches(row: SessionRow, query: SessionQuery) -> bool:
    session = view(row)
    if query.session_id is not None or query.display_name is not None:
        by_id = query.session_id is not None and session.session_id == query.session_id
        name = (session.display_name or "").lower()
        by_name = query.display_name is not None and all(w in name for w in query.display_name.lower().split())
        if not (by_id or by_name):
            return False
    if any(session.user_metadata.get(k) != v for k, v in query.user_metadata.items()):
        return False
    if query.statuses is not None:
        return any(s.type == session.status.type and (s.reason is None or s.reason == session.status.reason)
                   for s in query.statuses)
    return True


def _with_totals(session: SessionView, totals: tuple[int, int]) -> SessionView:
    return SessionView(**{**session.__dict__, "checkpoints_count": totals[0], "checkpoint_bytes": totals[1]})


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
