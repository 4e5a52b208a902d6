"""The training thread and the per-model queues it drains in seq_id order.

Every backend call runs on one thread, so the accelerator is used by one pass at a time and
backends need no locks. Each model has a queue keyed by `seq_id`; a job runs only when its
`seq_id` is the next one expected for its model.

Turns: among the models whose next job is ready, `FairShare` (`fairshare.py`) picks: the tenant (API key) that
was served the fewest tokens, then its least-served model, so a tenant's share of the trainer does not grow
with its number of runs, and one tenant's burst cannot starve another's steps. Jobs left waiting say why in
their future's queue state (`paused_capacity`: other keys' work goes first; `paused_rate_limit`: the key's own
other runs do), which `retrieve_future` reports to the SDK. The bytes of every tenant's queued jobs are counted
(`queued_bytes`) for its quota.

Gap policy: when a model's next `seq_id` has not arrived but later ones are waiting (a
submission the client gave up on), the queue waits `gap_timeout_s`, then skips to the lowest
waiting `seq_id` and logs a warning. A request that arrives after its turn was skipped fails with
a user error saying so; it is never run out of order.

A request refused at submission (bad input, a 4xx) still used up its `seq_id`: the client will
not send it again. `reject` marks such a `seq_id` done, so the queue moves past it at once
instead of waiting out the gap timeout.

Unsequenced jobs (model creation, create-from-checkpoint) run in arrival order, before any
sequenced job that is ready at the same moment.

Shared passes (`share=True`, the `shared_pass` setting): when the job picked first is `joinable`, the ready
jobs of other runs joinable in the same group (a base model) join it in fair-share order while their tokens fit
`SHARED_PASS_TOKENS`; each one taken is charged its own tokens, and they run in one call (`Joinable.run`), each
future resolved with its own result or error. A job cancelled while queued leaves the pass; one left alone runs
as it would without sharing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from tx.core.fairshare import Candidate, FairShare, tally
from tx.core.futures import Future, FutureRegistry
from tx.types import ErrorCategory

logger = logging.getLogger(__name__)

SHARED_PASS_TOKENS = 65_536  # most tokens of the jobs in one shared pass (the first one may be larger alone)


@dataclass(frozen=True)
class Joinable:
    """What lets a job share a pass: jobs whose `group` is equal run together as `run([item, ...])`, which
    returns each item's result or error, in order."""

    group: Hashable
    item: Any
    run: Callable[[list[Any]], list[Any]]


@dataclass
class Job:
    future: Future
    fn: Callable[[], Any]
    lease: Callable[[], AbstractContextManager[Any]] | None = None  # e.g. the accelerator, from colocated engines
    cost: float = 0.0  # tokens it trains on (fair share charges at least fairshare.MIN_COST)
    size: int = 0  # bytes it holds while queued (its request), for the tenant's quota
    joinable: Joinable | None = None  # may share its pass with other runs' jobs (see "Shared passes")


@dataclass
class ModelQueue:
    tenant: str = ""
    next_seq: int = 1
    pending: dict[int, Job] = field(default_factory=dict)
    rejected: set[int] = field(default_factory=set)  # seq_ids refused at submission: nothing to run
    blocked_since: float | None = None

    def move_past_rejected(self) -> None:
        while self.next_seq in self.rejected:
            self.rejected.discard(self.next_seq)
            self.next_seq += 1
        if self.rejected:
            self.rejected = {s for s in self.rejected if s > self.next_seq}


class Scheduler:
    def __init__(self, futures: FutureRegistry, gap_timeout_s: float, fair: FairShare | None = None,
                 share: bool = False) -> None:
        self._futures = futures
        self._share = share
        self._gap_timeout_s = gap_timeout_s
        self._queues: dict[str, ModelQueue] = {}
        self._unsequenced: deque[Job] = deque()
        self._cond = threading.Condition()
        self._fair = fair or FairShare()
        self._queued_bytes: dict[str, int] = {}  # tenant -> bytes of its queued jobs
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tx-training", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def add_model(self, model_id: str, next_seq: int = 1, tenant: str = "") -> None:
        with self._cond:
            self._queues.setdefault(model_id, ModelQueue(tenant=tenant, next_seq=next_seq))

    def remove_model(self, model_id: str) -> None:
        with self._cond:
            queue = self._queues.pop(model_id, None)
            if queue is not None:
                self._fair.forget(queue.tenant, model_id)
                for job in queue.pending.values():
                    tally(self._queued_bytes, queue.tenant, -job.size)
        for job in (queue.pending.values() if queue else ()):
            self._futures.fail(job.future, f"model {model_id!r} was removed", ErrorCategory.USER)

    def has_model(self, model_id: str) -> bool:
        with self._cond:
            return model_id in self._queues

    def submit_unsequenced(self, job: Job) -> None:
        with self._cond:
            self._unsequenced.append(job)
            self._cond.notify_all()

    def submit(self, model_id: str, seq_id: int, job: Job) -> None:
        with self._cond:
            queue = self._queues.get(model_id)
            if queue is None:
                error: str | None = f"model {model_id!r} is not loaded"
            elif seq_id < queue.next_seq:
                error = (
                    f"seq_id {seq_id} of model {model_id!r} arrived after its turn was skipped "
                    f"(the queue is at {queue.next_seq}); it was not run"
                )
            elif seq_id in queue.pending:
                error = f"seq_id {seq_id} of model {model_id!r} is already queued"
            else:
                error = None
                queue.rejected.discard(seq_id)
                queue.pending[seq_id] = job
                tally(self._queued_bytes, queue.tenant, job.size)
                self._cond.notify_all()
        if error is not None:
            self._futures.fail(job.future, error, ErrorCategory.USER)

    def reject(self, model_id: str, seq_id: int) -> None:
        """`seq_id` was refused at submission: count it as done (a no-op if it is queued or past)."""
        with self._cond:
            queue = self._queues.get(model_id)
            if queue is None or seq_id < queue.next_seq or seq_id in queue.pending:
                return
            queue.rejected.add(seq_id)
            queue.move_past_rejected()
            self._cond.notify_all()

    def queued_bytes(self, tenant: str) -> int:
        """Bytes of `tenant`'s jobs queued and not yet run."""
        with self._cond:
            return self._queued_bytes.get(tenant, 0)

    def usage(self) -> dict[str, tuple[int, int]]:
        """{tenant: (jobs queued, their bytes)} for tenants with queued jobs."""
        with self._cond:
            jobs: dict[str, int] = {}
            for queue in self._queues.values():
                if queue.pending:
                    jobs[queue.tenant] = jobs.get(queue.tenant, 0) + len(queue.pending)
            return {tenant: (count, self._queued_bytes.get(tenant, 0)) for tenant, count in jobs.items()}

    def queue_depths(self) -> dict[str, int]:
        """Requests waiting (submitted, not yet run) per model."""
        with self._cond:
            return {model_id: len(queue.pending) for model_id, queue in self._queues.items()}

    def queue_depth(self, model_id: str) -> int:
        with self._cond:
            queue = self._queues.get(model_id)
            return len(queue.pending) if queue else 0

    # -- the training thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:  # the job in hand was the last: a stopping server starts no other
                    return
                jobs = self._next_jobs()
                while not jobs and not self._stopping:
                    self._cond.wait(timeout=self._wait_time())
                    jobs = self._next_jobs()
                if not jobs:
                    return
            self._execute([job for job in jobs if self._futures.start(job.future)])  # less those cancelled

    def _next_jobs(self) -> list[Job]:
        """The jobs of the next pass: one, or several joined in a shared pass; none if nothing is ready."""
        if self._unsequenced:
            return [self._unsequenced.popleft()]
        now = time.monotonic()
        ready = [Candidate(queue.tenant, model_id, queue.pending[queue.next_seq].cost)
                 for model_id, queue in self._queues.items() if self._ready(model_id, queue, now)]
        taken = self._joining(self._fair.order(ready))
        jobs = []
        for candidate in taken:
            self._fair.charge(candidate)
            queue = self._queues[str(candidate.key)]
            jobs.append(queue.pending.pop(queue.next_seq))
            queue.next_seq += 1
            tally(self._queued_bytes, queue.tenant, -jobs[-1].size)
        _mark_waiting([c for c in ready if c not in taken], {c.tenant for c in taken}, self._queues)
        return jobs

    def _joining(self, order: list[Candidate]) -> list[Candidate]:
        """The first in fair-share order, and with sharing on the others that join its pass (same group, while
        their tokens fit), in that order; stops at the first that does not fit so none jumps ahead of it."""
        if not order:
            return []
        first = self._head(order[0]).joinable
        if not self._share or first is None:
            return order[:1]
        taken, tokens = order[:1], order[0].cost
        for candidate in order[1:]:
            joinable = self._head(candidate).joinable
            if joinable is None or joinable.group != first.group:
                continue
            if tokens + candidate.cost > SHARED_PASS_TOKENS:
                break
            taken.append(candidate)
            tokens += candidate.cost
        return taken

    def _head(self, candidate: Candidate) -> Job:
        queue = self._queues[str(candidate.key)]
        return queue.pending[queue.next_seq]

    def _ready(self, model_id: str, queue: ModelQueue, now: float) -> bool:
        """Whether the model's next job may run now (after skipping a gap that timed out)."""
        queue.move_past_rejected()
        if not queue.pending:
            queue.blocked_since = None
            return False
        if queue.next_seq not in queue.pending:
            if queue.blocked_since is None:
                queue.blocked_since = now
            if now - queue.blocked_since < self._gap_timeout_s:
                return False
            skipped_to = min(queue.pending)
            logger.warning(
                "model %s: seq_id %d never arrived within %.0fs; skipping to %d",
                model_id, queue.next_seq, self._gap_timeout_s, skipped_to,
            )
            queue.next_seq = skipped_to
        queue.blocked_since = None
        return True

    def _wait_time(self) -> float | None:
        blocked = [q.blocked_since for q in self._queues.values() if q.blocked_since is not None]
        if not blocked:
            return None
        return max(0.01, min(blocked) + self._gap_timeout_s - time.monotonic())

    def _execute(self, jobs: list[Job]) -> None:
        if len(jobs) > 1:
            self._execute_shared(jobs)
        elif jobs:
            self._execute_one(jobs[0])

    def _execute_one(self, job: Job) -> None:
        try:
            with job.lease() if job.lease is not None else contextlib.nullcontext():
                result = job.fn()
        except Exception as exc:  # noqa: BLE001 - the future carries every failure
            if self._futures.fail_with(job.future, exc) is ErrorCategory.SERVER:
                logger.exception("%s %s failed", job.future.kind, job.future.request_id)
        else:
            self._futures.resolve(job.future, result)

    def _execute_shared(self, jobs: list[Job]) -> None:
        """Jobs joined in one pass (all joinable, one group), under a lease if any of them takes one."""
        lease = next((job.lease for job in jobs if job.lease is not None), None)
        joinables = [job.joinable for job in jobs if job.joinable is not None]
        try:
            with lease() if lease is not None else contextlib.nullcontext():
                results = joinables[0].run([joinable.item for joinable in joinables])
        except Exception as exc:  # noqa: BLE001 - the pass itself failed: every job's future carries it
            results = [exc] * len(jobs)
        for job, result in zip(jobs, results, strict=True):
            if not isinstance(result, Exception):
                self._futures.resolve(job.future, result)
            elif self._futures.fail_with(job.future, result) is ErrorCategory.SERVER:
                logger.error("%s %s failed in a shared pass", job.future.kind, job.future.request_id,
                             exc_info=result)


def _mark_waiting(waiting: list[Candidate], picked: set[str], queues: dict[str, ModelQueue]) -> None:
    """Tell each ready job left waiting why (its future's queue state, read by retrieve_future); `picked`: the
    tenants whose work runs now."""
    others = len({c.tenant for c in waiting} - picked)
    for candidate in waiting:
        queue = queues[str(candidate.key)]
        future = queue.pending[queue.next_seq].future
        if candidate.tenant in picked:
            future.queue_state = "paused_rate_limit"
            future.queue_state_reason = "this key's other training runs take their turns first (fair share)"
        else:
            future.queue_state = "paused_capacity"
            future.queue_state_reason = (f"the trainer is running another key's work; {others + len(picked)} keys "
                                         "have work ready and take turns by tokens (fair share)")
