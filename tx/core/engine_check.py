"""The trainer's side of the engines' self-check (`tx/inference/manager/selfcheck.py`): the base model's forward
of the check's tokens, run on the training thread (the trainer's model is never touched from another), and
handed to the manager as plain lists. The core holds both the backend and the manager, which never import each
other (docs/architecture.md)."""

from __future__ import annotations

from tx.backends.base import TrainingBackend
from tx.core.futures import FutureRegistry
from tx.core.scheduler import Job, Scheduler
from tx.types import BaseLogprobs

OWNER = "tx"
WAIT_S = 600.0
"""Longest the check waits for the training thread (a long pass in flight) and the forward."""


class TrainerReference:
    """`Reference` for the engine manager: `await reference(base_model, sequences)`."""

    def __init__(self, backend: TrainingBackend, futures: FutureRegistry, scheduler: Scheduler) -> None:
        self._backend = backend
        self._futures = futures
        self._scheduler = scheduler

    async def __call__(self, base_model: str, sequences: list[list[int]]) -> BaseLogprobs | None:
        future, _ = self._futures.create(OWNER, "EngineSelfCheck")
        self._scheduler.submit_unsequenced(Job(future, lambda: self._backend.base_logprobs(base_model, sequences)))
        done = await self._futures.wait(future.request_id, OWNER, WAIT_S)
        if not done.done:
            raise TimeoutError(f"the trainer's forward of the check's tokens took over {WAIT_S:g} s")
        self._futures.forget([future.request_id], OWNER)
        if done.failure is not None:
            raise RuntimeError(done.failure.message)
        return done.result
