"""Futures: every long operation answers at once with a request id and resolves later.

A future is created on the event loop, resolved from any thread (the training thread, engine
clients), and waited on by `retrieve_future` long-polls. Resubmissions of the same operation
(the SDK re-sends a request with the same `(model, seq_id)` when a submission is retried) map to
the original future through a dedupe key.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Hashable

from tx.types import ErrorCategory, NotFoundError

logger = logging.getLogger(__name__)


@dataclass
class Failure:
    message: str
    category: ErrorCategory


@dataclass
class Future:
    request_id: str
    owner: str
    kind: str
    created_at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None
    result: Any = None
    failure: Failure | None = None
    _done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> bool:
        return self.finished_at is not None


class FutureRegistry:
    """Owns every future. Create and wait on the event loop; resolve or fail from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ttl_s: float) -> None:
        self._loop = loop
        self._ttl_s = ttl_s
        self._futures: dict[str, Future] = {}
        self._by_key: dict[Hashable, str] = {}
        self._lock = threading.Lock()

    def create(self, owner: str, kind: str, key: Hashable | None = None) -> tuple[Future, bool]:
        """(future, created). With a key already seen, the original future and False."""
        with self._lock:
            if key is not None and key in self._by_key:
                existing = self._futures.get(self._by_key[key])
                if existing is not None:
                    return existing, False
            future = Future(request_id=uuid.uuid4().hex, owner=owner, kind=kind)
            self._futures[future.request_id] = future
            if key is not None:
                self._by_key[key] = future.request_id
            return future, True

    def find(self, key: Hashable) -> Future | None:
        """The future created under `key`, if it is still held."""
        with self._lock:
            request_id = self._by_key.get(key)
            return None if request_id is None else self._futures.get(request_id)

    def resolve(self, future: Future, result: Any) -> None:
        self._finish(future, result, None)

    def fail(self, future: Future, message: str, category: ErrorCategory) -> None:
        self._finish(future, None, Failure(message, category))

    def _finish(self, future: Future, result: Any, failure: Failure | None) -> None:
        if future.done:
            return
        future.result, future.failure = result, failure
        future.finished_at = time.monotonic()
        self._loop.call_soon_threadsafe(future._done.set)

    def get(self, request_id: str, owner: str) -> Future:
        future = self._futures.get(request_id)
        if future is None or future.owner != owner:
            raise NotFoundError(f"unknown or expired request_id {request_id!r}")
        return future

    async def wait(self, request_id: str, owner: str, timeout_s: float) -> Future:
        """The future, once done or after `timeout_s` (check `.done`)."""
        future = self.get(request_id, owner)
        if not future.done:
            try:
                await asyncio.wait_for(future._done.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        return future

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
