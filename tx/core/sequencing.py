"""The sequencing rules of one run's calls: each sequenced call (forward_backward, optim_step, saves,
load_state) names a `seq_id`, and runs on the training thread in `seq_id` order (`scheduler.py`).

- A call is checked here, before a future exists: the run must be the caller's and loaded on this server,
  `seq_id >= 1`, and `check` (the batch rules) must pass. A refused call raises a 4xx error.
- A refused call used its `seq_id` all the same (`reject`): the queue moves past it at once.
- A resent `(model, seq_id)` answers with the original future.
- A call's bytes count against its key's `queued_training_bytes` quota until it runs (`quotas.py`): past it,
  the call is refused (429, the client retries once queued work ran).
- A queued call moves its run's `last_request_time` in the store, at most once per `TOUCH_EVERY_S` per run
  (a store write per call was two commits per training step; docs/operations.md#the-training-steps-overhead).
- A call reads its run's row through `run`: the store once per run, then this process's copy (the ORM read was
  ~0.4 ms of Python per call). What the calls read of it (owner, session, base model, optimizer, copied_from)
  never changes: a run's row is never deleted, re-owned or made again under its id. The owner is checked on
  every call, so another key's call is refused exactly as the store refuses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from tx.core import quotas
from tx.core.futures import Future, FutureRegistry
from tx.core.quotas import QuotaLimits
from tx.core.scheduler import Job, Joinable, Scheduler
from tx.store.store import Store
from tx.store.tables import TrainingRunRow
from tx.types import NotFoundError, UserError

Lease = Callable[[], AbstractContextManager[Any]]  # held around a training pass (the engines' colocation)
TOUCH_EVERY_S = 1.0  # a run's last_request_time is written at most this often (seconds), by this process
MAX_RUN_ROWS = 4096  # run rows kept by `Sequencer.run`; past it the copies start over
TOUCH_MARGIN_S = 0.1  # `queues_in_memory` says no when a last_request_time write falls due within this


class Sequencer:
    def __init__(self, store: Store, futures: FutureRegistry, scheduler: Scheduler,
                 limits: QuotaLimits | None = None) -> None:
        self.store = store
        self.futures = futures
        self.scheduler = scheduler
        self.limits = limits or QuotaLimits()
        self.touch_every_s = TOUCH_EVERY_S
        self._touched: dict[str, float] = {}  # run -> when this process last wrote its last_request_time
        self._rows: dict[str, TrainingRunRow] = {}  # run -> its row, as read once (see the module's docstring)

    def run(self, model_id: str, owner: str) -> TrainingRunRow:
        """`owner`'s row of `model_id` (NotFoundError if the run is not theirs), read from the store once.
        Only its fixed fields may be read (not `last_request_time`): the copy is not refreshed."""
        row = self._rows.get(model_id)
        if row is None:
            row = self.store.get_run(model_id, owner)
            if len(self._rows) >= MAX_RUN_ROWS:
                self._rows = {}
            self._rows[model_id] = row
        elif row.owner != owner:
            raise NotFoundError(f"training run {model_id!r} not found")
        return row

    def queues_in_memory(self, model_id: str) -> bool:
        """Whether a call on `model_id` would be checked and queued without the store: its row is kept (`run`)
        and no write of its last_request_time falls due within `TOUCH_MARGIN_S`. The routes then queue it on
        the event loop instead of through a worker thread (a thread hop per call, taking the GIL from the pass).
        Any other owner's call is still refused by `run`; a call that takes longer than the margin to queue
        writes on the loop once, which costs time, not correctness."""
        touched = self._touched.get(model_id)
        return (model_id in self._rows and touched is not None
                and time.monotonic() - touched < self.touch_every_s - TOUCH_MARGIN_S)

    def submit(self, owner: str, model_id: str, seq_id: int, kind: str, fn: Callable[[], Any],
               lease: Lease | None = None, check: Callable[[], None] | None = None, *,
               cost: float = 0.0, size: int = 0, joinable: Joinable | None = None,
               run: TrainingRunRow | None = None) -> Future:
        """Queue `fn` as `model_id`'s call `seq_id`. `check` raises (a UserError) for work that can never run:
        it is refused here, before a future exists, and the route counts its seq_id as used. `cost`: the tokens
        it trains on (fair share); `size`: the bytes it holds while queued (the key's quota); `joinable`: lets it
        share a pass with other runs' calls (`scheduler.py`, "Shared passes"); `run`: the caller's row of
        `model_id` if this request already read it (`run(model_id, owner)`), not read again."""
        run = run if run is not None else self.run(model_id, owner)
        if run.copied_from is not None:
            raise UserError(f"training run {model_id!r} holds a copy of {run.copied_from} and is never trained; "
                            "create a training client from its checkpoint")
        if seq_id < 1:
            raise UserError(f"seq_id must be >= 1, got {seq_id}")
        if not self.scheduler.has_model(model_id):
            raise UserError(
                f"model {model_id!r} is not loaded on this server (it may have been restarted); "
                "create a training client from one of its checkpoints"
            )
        if check is not None:
            check()
        resent = self.futures.find(("seq", model_id, seq_id))
        if resent is not None:
            return resent
        quotas.check("queued_training_bytes", self.scheduler.queued_bytes(owner), size,
                     self.limits.queued_training_bytes)
        future, created = self.futures.create(
            owner, kind, ("seq", model_id, seq_id), session_id=run.session_id, track=model_id
        )
        if not created:
            return future
        self.scheduler.submit(model_id, seq_id, Job(future, fn, lease, cost=cost, size=size, joinable=joinable))
        self._touch(model_id)  # after: a store write (a disk sync, ~10 ms) is no part of the step
        return future

    def _touch(self, model_id: str) -> None:
        """The run's last_request_time, unless this process wrote it less than `touch_every_s` ago (a race
        between two request threads writes it twice, which is harmless)."""
        now = time.monotonic()
        if now - self._touched.get(model_id, -self.touch_every_s) >= self.touch_every_s:
            self._touched[model_id] = now
            self.store.touch_run(model_id)

    def reject(self, owner: str, model_id: str, seq_id: int) -> None:
        """A sequenced request of `owner` was refused at submission: its seq_id counts as done."""
        try:
            self.run(model_id, owner)
        except NotFoundError:
            return  # not the caller's run: it may not move another tenant's queue
        self.scheduler.reject(model_id, seq_id)
