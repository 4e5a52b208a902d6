"""Fair share between tenants (API keys), weighted by tokens: who goes next among ready work.

The policy is start-time fair queuing over two levels. Each tenant has a served count: the tokens of the work
it was given, divided by its weight. The next turn goes to the ready tenant with the least served, and within
it to the ready run (or other key) with the least served. A tenant that had nothing ready is lifted to the
current service level when it becomes ready again, so idling banks no credit. So a tenant submitting 8x the work
of another gets the accelerator when the other has nothing ready, and no more than an equal share of tokens
when both have; the other's steps never wait behind more than the work in progress.

Users:
- the training thread (`core/scheduler.py`): candidates are the runs whose next call is ready; the picked one
  runs and is charged its tokens;
- the sampling gate (`core/sampling/gate.py`): candidates are the tenants with samples waiting for engine
  capacity; charged num_samples x (prompt + max_tokens) tokens.

A caller that fuses several runs into one pass takes `order(candidates)` and adds runs in that order while they
fit, then `charge`s each one it took. Not thread-safe: its user holds its own lock around it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

MIN_COST = 64.0  # tokens charged for work that carries none (optim_step, saves): a turn is never free


@dataclass(frozen=True)
class Candidate:
    """Ready work: `key` (a run id, or the tenant itself) of `tenant`, costing `cost` tokens if picked."""

    tenant: str
    key: Hashable
    cost: float


class _Ledger:
    """Served cost per member, with the current service level (the served count of the last one picked)."""

    def __init__(self) -> None:
        self.served: dict[Hashable, float] = {}
        self.level = 0.0

    def lift(self, members: set[Hashable]) -> None:
        for member in members:
            self.served[member] = max(self.served.get(member, self.level), self.level)

    def charge(self, member: Hashable, amount: float) -> None:
        self.level = self.served.get(member, self.level)
        self.served[member] = self.level + amount

    def forget(self, member: Hashable) -> None:
        self.served.pop(member, None)


def tally(counts: dict[str, int], tenant: str, delta: int) -> None:
    """Add `delta` to `tenant`'s count in `counts`, dropping the tenant at zero (counts list only tenants holding
    something: the queues' bytes, the sequences in flight)."""
    left = counts.get(tenant, 0) + delta
    if left > 0:
        counts[tenant] = left
    else:
        counts.pop(tenant, None)


class FairShare:
    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        """`weights`: a tenant's share relative to others (default 1 for every tenant)."""
        self._weights = dict(weights or {})
        self._tenants = _Ledger()
        self._keys: dict[str, _Ledger] = {}

    def order(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """`candidates`, the one to serve first first: tenants by least served (ties: the order given), each
        tenant's keys by least served; then round robin over the tenants (a tenant's second key after every
        tenant's first), which is how a pass that takes several should fill."""
        tenants: dict[str, list[tuple[int, Candidate]]] = {}
        for index, candidate in enumerate(candidates):
            tenants.setdefault(candidate.tenant, []).append((index, candidate))
        self._tenants.lift(set(tenants))
        queues = []
        for tenant, items in sorted(tenants.items(), key=lambda t: (self._tenants.served[t[0]], t[1][0][0])):
            ledger = self._keys.setdefault(tenant, _Ledger())
            ledger.lift({c.key for _, c in items})
            queues.append([c for _, c in sorted(items, key=lambda item: (ledger.served[item[1].key], item[0]))])
        return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]

    def pick(self, candidates: Sequence[Candidate]) -> Candidate | None:
        """The candidate to serve now (charge it with `charge` once it is taken), or None if there is none."""
        return self.order(candidates)[0] if candidates else None

    def charge(self, candidate: Candidate, cost: float | None = None) -> None:
        """Count `cost` (default the candidate's) tokens as served to its tenant and key."""
        amount = max(MIN_COST, candidate.cost if cost is None else cost)
        self._tenants.charge(candidate.tenant, amount / self._weights.get(candidate.tenant, 1.0))
        self._keys.setdefault(candidate.tenant, _Ledger()).charge(candidate.key, amount)

    def forget(self, tenant: str, key: Hashable) -> None:
        """`key` is gone (a run unloaded): drop its count."""
        ledger = self._keys.get(tenant)
        if ledger is not None:
            ledger.forget(key)

    def served(self) -> dict[str, float]:
        """Tokens served per tenant (divided by its weight), for the usage view."""
        return {str(tenant): value for tenant, value in self._tenants.served.items()}
