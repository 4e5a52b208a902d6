"""The run page's metric columns kept as the JSON already written, so that a reload of a long run's page (20,000
recorded calls) answers from memory instead of reading, transposing and encoding every row again (~150 ms of
a worker thread, more on a busy host).

Only whole reads (`after_seq=0`, the page's first) are kept, keyed by run id and the read's limit, and each is
valid while the run's `recorded` (its newest call's seq, the rows it keeps) is what the rows read said: a new
call raises the seq and thinning lowers the row count, so either makes the kept answer miss, whichever process
wrote the rows. Bounded by bytes, least recently read first out. The caller's scope is checked before a read
(the run's summary, read fresh each time), never by the cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

MAX_BYTES = 32 * 1024 * 1024  # ~16 runs of 20,000 calls (~1.9 MB each)

Recorded = tuple[int, int]  # (newest seq, rows)


class MetricsCache:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, int], tuple[Recorded, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # read and written from the routes' worker threads

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, run_id: str, limit: int, recorded: Recorded) -> bytes | None:
        """The kept answer of the run's whole read with `limit`, if it was read at `recorded`."""
        with self._lock:
            entry = self._entries.get((run_id, limit))
            if entry is None or entry[0] != recorded:
                return None
            self._entries.move_to_end((run_id, limit))
            return entry[1]

    def put(self, run_id: str, limit: int, recorded: Recorded, body: bytes) -> None:
        """Keep `body`, the run's whole read with `limit` whose rows said `recorded` (the last one's seq, how many);
        replaces the run's older answer and drops the least recently read ones past the byte budget."""
        with self._lock:
            old = self._entries.pop((run_id, limit), None)
            if old is not None:
                self._bytes -= len(old[1])
            if len(body) > self._max_bytes:
                return
            self._entries[(run_id, limit)] = (recorded, body)
            self._bytes += len(body)
            while self._bytes > self._max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= len(dropped)
