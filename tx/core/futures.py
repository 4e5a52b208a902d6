"""Futures: every long operation answers at once with a request id and resolves later.

A future is created on the event loop, resolved from any thread (the training thread, engine
clients), and waited on by `retrieve_future` long-polls. Resubmissions of the same operation
(the SDK re-sends a request with the same `(model, seq_id)` when a submission is retried) map to
the original future through a dedupe key.

A future that belongs to a session (`session_id`) records its timing into the session's
timeline when it finishes (`tx.core.timeline`), for `tinker session export-trace`. A future that
has not started can be cancelled: it fails with a "cancelled" error and its job is skipped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Hashable, Literal

from tx.core.completions import CompletionFeeds, Target
from tx.core.timeline import SessionTimeline, Span
from tx.types import ConflictError, ErrorCategory, NotFoundError, UserError

logger = logging.getLogger(__name__)
QueueState = Literal["active", "paused_capacity", "paused_rate_limit"]  # the SDK's (TryAgainResponse)


@dataclass
class Failure:
    message: str
    category: ErrorCategory


def failure_for(exc: BaseException) -> Failure:
    """The one mapping from an exception to a future's failure: domain errors (bad input, a missing or
    conflicting resource) are the user's; anything else is the server's, named by its type."""
    if isinstance(exc, (UserError, NotFoundError, ConflictError)):
        return Failure(str(exc), ErrorCategory.USER)
    return Failure(f"{type(exc).__name__}: {exc}", ErrorCategory.SERVER)


@dataclass
class Future:
    request_id: str
    owner: str
    kind: str
    session_id: str | None = None
    track: str = ""  # the training run or sampler it belongs to
    feed: Target | None = None  # the retrieve_futures target told when it finishes
    created_at: float = field(default_factory=time.monotonic)
    submitted_wall: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    result: Any = None
    failure: Failure | None = None
    # why it waits, while it waits (the SDK's queue states: active | paused_capacity | paused_rate_limit)
    queue_state: QueueState = "active"
    queue_state_reason: str | None = None
    _done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> bool:
        return self.finished_at is not None


class FutureRegistry:
    """Owns every future. Create and wait on the event loop; resolve or fail from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ttl_s: float,
                 timeline: SessionTimeline | None = None) -> None:
        self._loop = loop
        self.timeline = timeline or SessionTimeline()
        self.feeds = CompletionFeeds()
        self._ttl_s = ttl_s
        self._futures: dict[str, Future] = {}
        self._by_key: dict[Hashable, str] = {}
        self._lock = threading.Lock()

    def create(
        self, owner: str, kind: str, key: Hashable | None = None, *, session_id: str | None = None,
        track: str = "", feed: Target | None = None,
    ) -> tuple[Future, bool]:
        """(future, created). With a key already seen, the original future and False."""
        with self._lock:
            if key is not None and key in self._by_key:
                existing = self._futures.get(self._by_key[key])
                if existing is not None:
                    return existing, False
            future = Future(request_id=uuid.uuid4().hex, owner=owner, kind=kind, session_id=session_id,
                            track=track, feed=feed)
            self._futures[future.request_id] = future
            if key is not None:
                self._by_key[key] = future.request_id
            return future, True

    def find(self, key: Hashable) -> Future | None:
        """The future created under `key`, if it is still held."""
        with self._lock:
            request_id = self._by_key.get(key)
            return None if request_id is None else self._futures.get(request_id)

    def start(self, future: Future) -> bool:
        """Mark `future` as running; False if it was cancelled (or otherwise finished) first."""
        with self._lock:
            if future.done:
                return False
            future.started_at = time.monotonic()
            future.queue_state, future.queue_state_reason = "active", None
            return True

    def cancel(self, request_id: str, owner: str) -> Future:
        """Fail a future that has not started yet; a finished one is left as it is."""
        future = self.get(request_id, owner)
        with self._lock:
            if future.started_at is not None and not future.done and future.kind != "Sample":
                raise ConflictError(f"request {request_id!r} ({future.kind}) is already running")
        self.fail(future, "cancelled by the client", ErrorCategory.USER)
        return future

    def resolve(self, future: Future, result: Any) -> None:
        self._finish(future, result, None)

    def fail(self, future: Future, message: str, category: ErrorCategory) -> None:
        self._finish(future, None, Failure(message, category))

    def fail_with(self, future: Future, exc: BaseException) -> ErrorCategory:
        """Fail `future` with `exc` (see `failure_for`); returns the category, so servers' can be logged."""
        failure = failure_for(exc)
        self._finish(future, None, failure)
        return failure.category

    def _finish(self, future: Future, result: Any, failure: Failure | None) -> None:
        with self._lock:
            if future.done:
                return
            future.result, future.failure = result, failure
            future.finished_at = time.monotonic()
        self._loop.call_soon_threadsafe(future._done.set)
        if future.feed is not None:
            self._loop.call_soon_threadsafe(self.feeds.publish, future.feed, future.request_id, failure is not None)
        if future.session_id is not None:
            self.timeline.record(future.session_id, _span(future))

    def get(self, request_id: str, owner: str) -> Future:
        future = self._futures.get(request_id)
        if future is None or future.owner != owner:
            raise NotFoundError(f"unknown or expired request_id {request_id!r}")
        return future

    async def wait(self, request_id: str, owner: str, timeout_s: float) -> Future:
        """The future, once done or after `timeout_s` (check `.done`)."""
        future = self.get(request_id, owner)
        if not future.done:
            try:  # not wait_for: it wraps the wait in a task of its own, a loop turn more each way
                async with asyncio.timeout(timeout_s):
                    await future._done.wait()
            except TimeoutError:
                pass
        return future

    def forget(self, request_ids: list[str], owner: str) -> None:
        """Drop finished futures whose results the client has fetched (retrieve_futures' acks)."""
        with self._lock:
            for rid in request_ids:
                future = self._futures.get(rid)
                if future is not None and future.owner == owner and future.done:
                    del self._futures[rid]

    def pending(self) -> int:
        """Futures not resolved yet."""
        with self._lock:
            return sum(not f.done for f in self._futures.values())

    def expire(self, now: float | None = None) -> int:
        """Forget finished futures older than the TTL; returns how many were dropped."""
        now = time.monotonic() if now is None else now
        with self._lock:
            old = [
                rid
                for rid, f in self._futures.items()
                if f.finished_at is not None and now - f.finished_at > self._ttl_s
            ]
            for rid in old:
                del self._futures[rid]
            self._by_key = {k: v for k, v in self._by_key.items() if v in self._futures}
        return len(old)


def _span(future: Future) -> Span:
    wall = future.submitted_wall - future.created_at  # monotonic -> unix seconds
    assert future.finished_at is not None
    return Span(
        request_id=future.request_id, kind=future.kind, track=future.track or future.kind,
        submitted=future.submitted_wall,
        started=None if future.started_at is None else future.started_at + wall,
        finished=future.finished_at + wall, failed=future.failure is not None,
    )
