"""Per-session timelines of finished operations, and their Chrome/Perfetto trace.

Every future that belongs to a session leaves one span here when it finishes: when it was
submitted, when it started running (the training thread picked it, or the sample went to an
engine) and when it finished. `chrome_trace` turns a session's spans into the Trace Event JSON
that ui.perfetto.dev and chrome://tracing open: one track per training run or sampler, a
"queued" slice and a run slice per operation.

Spans live in memory, bounded (`max_spans` per session, `max_sessions` sessions, the least recently
active dropped first), so a trace covers what this server process saw.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Span:
    request_id: str
    kind: str
    track: str
    submitted: float  # unix seconds
    started: float | None  # None: it never ran (cancelled or failed while queued)
    finished: float
    failed: bool


class SessionTimeline:
    def __init__(self, max_spans: int = 5_000, max_sessions: int = 200) -> None:
        self._spans: OrderedDict[str, deque[Span]] = OrderedDict()
        self._max_spans, self._max_sessions = max_spans, max_sessions
        self._lock = threading.Lock()

    def record(self, session_id: str, span: Span) -> None:
        with self._lock:
            spans = self._spans.pop(session_id, None) or deque(maxlen=self._max_spans)
            spans.append(span)
            self._spans[session_id] = spans
            while len(self._spans) > self._max_sessions:
                self._spans.popitem(last=False)

    def spans(self, session_id: str) -> list[Span]:
        with self._lock:
            return list(self._spans.get(session_id, ()))


def chrome_trace(session_id: str, spans: list[Span]) -> dict[str, Any]:
    """Trace Event Format: complete ("X") events in microseconds, one thread per track."""
    tracks = {track: tid for tid, track in enumerate(sorted({s.track for s in spans}), start=1)}
    events: list[dict[str, Any]] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"session {session_id}"}}]
    events += [{"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": track}}
               for track, tid in tracks.items()]
    for span in sorted(spans, key=lambda s: s.submitted):
        tid, args = tracks[span.track], {"request_id": span.request_id, "failed": span.failed}
        ran_from = span.started if span.started is not None else span.finished
        events.append(_slice(f"{span.kind} (queued)", "queue", span.submitted, ran_from, tid, args))
        if span.started is not None:
            events.append(_slice(span.kind, "run", span.started, span.finished, tid, args))
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"session_id": session_id}}


def _slice(name: str, category: str, start: float, end: float, tid: int, args: dict) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": category, "pid": 1, "tid": tid,
            "ts": round(start * 1e6), "dur": max(0, round((end - start) * 1e6)), "args": args}
