"""Shared passes in the training scheduler (tx/core/scheduler.py): ready joinable jobs of one group run in one
call, taken in fair-share order up to the token budget, each future resolved with its own result or error;
with sharing off, or across groups, each runs alone."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from tx.core.fairshare import FairShare
from tx.core.futures import Future, FutureRegistry
from tx.core.scheduler import SHARED_PASS_TOKENS, Job, Joinable, Scheduler
from tx.types import ErrorCategory, UserError

Queued = tuple[str, str, str, float]  # (model, tenant, group, cost)


class Passes:
    """Records each call: one item alone (`fn`) or several together (`run`); item "bad" fails alone."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def alone(self, item: str) -> str:
        return self.run([item])[0]

    def run(self, items: list[Any]) -> list[Any]:
        with self._lock:
            self.calls.append(list(items))
        return [UserError(f"{item} is bad") if item == "bad" else f"ran {item}" for item in items]


def schedule(queued: list[Queued], share: bool, fair: FairShare | None = None,
             cancel: str = "") -> tuple[list[list[str]], dict]:
    """Queue one job per model before the thread starts (`cancel`'s cancelled while queued), run them all:
    (the calls, {model: its future})."""

    async def go() -> tuple[list[list[str]], dict[str, Future]]:
        futures = FutureRegistry(asyncio.get_running_loop(), ttl_s=60)
        scheduler = Scheduler(futures, gap_timeout_s=60, fair=fair, share=share)
        passes, made = Passes(), {}
        for model, tenant, group, cost in queued:
            scheduler.add_model(model, tenant=tenant)
            made[model], _ = futures.create(tenant, "ForwardBackward")
            joinable = Joinable(group, model, passes.run) if group else None
            job = Job(made[model], lambda m=model: passes.alone(m), cost=cost, joinable=joinable)
            scheduler.submit(model, 1, job)
        if cancel:
            futures.fail(made[cancel], "cancelled by the client", ErrorCategory.USER)
        scheduler.start()
        while not all(f.done for f in made.values()):
            await asyncio.sleep(0.01)
        scheduler.stop(5)
        return passes.calls, made

    return asyncio.run(go())


def test_ready_runs_of_one_base_share_a_pass_in_fair_share_order() -> None:
    calls, made = schedule([("a1", "a", "base", 100), ("a2", "a", "base", 100), ("b1", "b", "base", 100),
                            ("c1", "c", "other", 100), ("opt", "b", "", 0)], share=True)
    assert calls[0] == ["a1", "b1", "a2"]  # a's first, b's first, then a's second: round robin over keys
    assert sorted(map(tuple, calls[1:])) == [("c1",), ("opt",)]  # another base, and a job that cannot join
    assert {m: f.result for m, f in made.items()} == {m: f"ran {m}" for m in made}


def test_with_sharing_off_each_job_runs_alone() -> None:
    calls, _ = schedule([("a1", "a", "base", 100), ("b1", "b", "base", 100)], share=False)
    assert calls == [["a1"], ["b1"]]


def test_a_pass_takes_jobs_while_their_tokens_fit_and_none_jumps_ahead() -> None:
    half = SHARED_PASS_TOKENS / 2
    calls, _ = schedule([("a1", "a", "base", half), ("b1", "b", "base", half + 1), ("c1", "c", "base", 1)],
                        share=True)
    assert calls == [["a1"], ["b1", "c1"]]  # c1 would fit beside a1, but b1 is before it


def test_each_job_of_a_pass_gets_its_own_error() -> None:
    _, made = schedule([("a1", "a", "base", 100), ("bad", "b", "base", 100)], share=True)
    assert made["a1"].result == "ran a1" and made["a1"].failure is None
    assert made["bad"].failure is not None and made["bad"].failure.category is ErrorCategory.USER


def test_each_job_of_a_pass_is_charged_its_tokens() -> None:
    fair = FairShare()
    schedule([("a1", "a", "base", 1000), ("b1", "b", "base", 100)], share=True, fair=fair)
    assert fair.served()["a"] - fair.served()["b"] >= 900  # a's next turn waits until b has had its tokens


def test_a_job_cancelled_while_queued_leaves_the_pass() -> None:
    calls, made = schedule([("a1", "a", "base", 100), ("b1", "b", "base", 100)], share=True, cancel="b1")
    assert calls == [["a1"]] and made["a1"].result == "ran a1"  # a1 alone, as without sharing
