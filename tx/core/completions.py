"""The batch long-poll behind `retrieve_futures` (row 22): one feed per polled target.

A target is one sampling session's clone, `(sampling_session_id, cloned_sampler_id)`; a sample's
clone is `seq_id // 1e9`. When one of its samples finishes, the feed appends an event with the
next cursor. A poll returns every event after `prev_cursor` and forgets those at or before it
(the client has seen them); with none it waits up to the poll's timeout for one (0: ack only).
The client then fetches each payload with `retrieve_future`.

Memory is bounded: at most `max_events` events are held over all targets. Past that, whole feeds
go, the least recently polled first (a feed nobody polls, e.g. of an SDK not using the poller, goes
first). Runs on the event loop only: `publish` is scheduled there by the future registry.
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
    events: deque[Completion] = field(default_factory=deque)
    cursor: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class CompletionFeeds:
    def __init__(self, max_events: int = 100_000) -> None:
        self._feeds: OrderedDict[Target, _Feed] = OrderedDict()  # least recently polled first
        self._max_events = max_events
        self._held = 0

    def publish(self, target: Target, request_id: str, failed: bool) -> None:
        feed = self._feeds.get(target)
        if feed is None:  # never polled yet: first in line to be dropped
            feed = self._feeds[target] = _Feed()
            self._feeds.move_to_end(target, last=False)
        feed.cursor += 1
        feed.events.append(Completion(feed.cursor, request_id, failed))
        self._held += 1
        feed.changed.set()
        while self._held > self._max_events:
            _, dropped = self._feeds.popitem(last=False)
            self._held -= len(dropped.events)

    async def poll(self, target: Target, prev_cursor: int, timeout_s: float) -> tuple[list[Completion], int]:
        """(events after `prev_cursor`, the cursor to send next), waiting up to `timeout_s` for one."""
        feed = self._feeds.pop(target, None) or _Feed()
        self._feeds[target] = feed  # now the most recently polled
        while feed.events and feed.events[0].cursor <= prev_cursor:
            feed.events.popleft()
            self._held -= 1
        if not feed.events and timeout_s > 0:
            feed.changed.clear()
            try:
                await asyncio.wait_for(feed.changed.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        events = [e for e in feed.events if e.cursor > prev_cursor]
        return events, (events[-1].cursor if events else max(prev_cursor, 0))
