"""The batch long-poll behind `retrieve_futures` (row 22): one feed per polled target.

A target is one sampling session's clone, `(sampling_session_id, cloned_sampler_id)`; a sample's
clone is `seq_id // 1e9`. When one of its samples finishes, the feed appends an event with the
next cursor. A poll returns every event after `prev_cursor` and forgets those at or before it
(the client has seen them); with none it waits up to the poll's timeout for one (0: ack only).
The client then fetches each payload with `retrieve_future`.

Runs on the event loop only: `publish` is scheduled there by the future registry.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass, field

Target = tuple[str, int]
CLONE_BLOCK = 1_000_000_000


@dataclass(frozen=True)
class Completion:
    cursor: int
    request_id: str
    failed: bool


@dataclass
class _Feed:
    events: deque[Completion] = field(default_factory=lambda: deque(maxlen=100_000))
    cursor: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class CompletionFeeds:
    def __init__(self, max_targets: int = 10_000) -> None:
        self._feeds: OrderedDict[Target, _Feed] = OrderedDict()
        self._max_targets = max_targets

    def publish(self, target: Target, request_id: str, failed: bool) -> None:
        feed = self._feed(target)
        feed.cursor += 1
        feed.events.append(Completion(feed.cursor, request_id, failed))
        feed.changed.set()

    async def poll(self, target: Target, prev_cursor: int, timeout_s: float) -> tuple[list[Completion], int]:
        """(events after `prev_cursor`, the cursor to send next), waiting up to `timeout_s` for one."""
        feed = self._feed(target)
        while feed.events and feed.events[0].cursor <= prev_cursor:
            feed.events.popleft()
        if not feed.events and timeout_s > 0:
            feed.changed.clear()
            try:
                await asyncio.wait_for(feed.changed.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        events = [e for e in feed.events if e.cursor > prev_cursor]
        return events, (events[-1].cursor if events else max(prev_cursor, 0))

    def _feed(self, target: Target) -> _Feed:
        feed = self._feeds.pop(target, None) or _Feed()
        self._feeds[target] = feed
        while len(self._feeds) > self._max_targets:
            self._feeds.popitem(last=False)
        return feed
