"""The sampling gate: how many sequences go to one base model's engines at once, and whose go next.

Engines queue what they are sent and serve it in order, so a key that sends 1,000 samples would hold every
other key's behind its own. The gate keeps at most `capacity` sequences (rows) in flight at the engines; the rest
wait here, one queue per tenant (API key), and as rows come back the next waiting sample is picked by
`FairShare` over tenants, charged num_samples x (prompt + max_tokens) tokens. A sample larger than the capacity
goes alone, when nothing else is in flight. A waiting sample's future says why it waits (`paused_rate_limit`:
its key already has its share in flight; `paused_capacity`: other keys' samples fill the engines).

Runs on the event loop only (no locks).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from tx.core.fairshare import Candidate, FairShare, tally
from tx.core.futures import Future


@dataclass
class _Waiter:
    rows: int
    cost: float
    ready: asyncio.Future[None]
    future: Future | None  # the sample's own future, told why it waits


class SamplingGate:
    def __init__(self, capacity: int, fair: FairShare | None = None) -> None:
        self.capacity = capacity
        self._fair = fair or FairShare()
        self._waiting: dict[str, deque[_Waiter]] = {}
        self._in_flight: dict[str, int] = {}  # tenant -> rows at the engines

    @property
    def rows_in_flight(self) -> int:
        return sum(self._in_flight.values())

    async def acquire(self, tenant: str, rows: int, cost: float, future: Future | None = None) -> None:
        """Wait until `rows` more sequences of `tenant` may go to the engines; then they count as in flight
        until `release`. Cancelled while waiting, it takes nothing."""
        waiter = _Waiter(rows, cost, asyncio.get_running_loop().create_future(), future)
        self._waiting.setdefault(tenant, deque()).append(waiter)
        self._dispatch()
        if not waiter.ready.done():
            self._explain(tenant, waiter)
        try:
            await waiter.ready
        except asyncio.CancelledError:
            if waiter.ready.done() and not waiter.ready.cancelled():
                self.release(tenant, rows)  # it was let through as it was cancelled
            else:
                self._drop(tenant, waiter)
            raise

    def release(self, tenant: str, rows: int) -> None:
        tally(self._in_flight, tenant, -rows)
        self._dispatch()

    def usage(self) -> dict[str, tuple[int, int]]:
        """{tenant: (rows in flight, rows waiting)}; safe from another thread (copies are taken whole first)."""
        in_flight = dict(self._in_flight)
        waiting = {tenant: sum(w.rows for w in list(queue)) for tenant, queue in list(self._waiting.items())}
        return {t: (in_flight.get(t, 0), waiting.get(t, 0)) for t in in_flight.keys() | waiting.keys()}

    def _dispatch(self) -> None:
        while self._waiting:
            heads = [Candidate(tenant, tenant, queue[0].cost) for tenant, queue in self._waiting.items()]
            picked = self._fair.pick(heads)
            assert picked is not None
            tenant = picked.tenant
            waiter = self._waiting[tenant][0]
            if self.rows_in_flight and self.rows_in_flight + waiter.rows > self.capacity:
                return  # the most deserving waits for room; nobody jumps ahead of it
            self._waiting[tenant].popleft()
            if not self._waiting[tenant]:
                del self._waiting[tenant]
            self._fair.charge(picked)
            tally(self._in_flight, tenant, waiter.rows)
            if waiter.future is not None:
                waiter.future.queue_state, waiter.future.queue_state_reason = "active", None
            waiter.ready.set_result(None)
        return

    def _drop(self, tenant: str, waiter: _Waiter) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._waiting[tenant]
        self._dispatch()

    def _explain(self, tenant: str, waiter: _Waiter) -> None:
        if waiter.future is None:
            return
        active = len(self._in_flight.keys() | self._waiting.keys())
        mine = self._in_flight.get(tenant, 0)
        if mine >= self.capacity / max(active, 1):
            waiter.future.queue_state = "paused_rate_limit"
            waiter.future.queue_state_reason = (f"this key has {mine} sequences sampling, its fair share of the "
                                                f"engines' {self.capacity}; the rest wait their turn")
        else:
            waiter.future.queue_state = "paused_capacity"
            waiter.future.queue_state_reason = (f"the engines are full ({self.rows_in_flight} of {self.capacity} "
                                                "sequences); keys take turns by tokens (fair share)")
