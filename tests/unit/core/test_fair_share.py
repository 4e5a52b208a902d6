"""Fair share between tenants (tx/core/fairshare.py), in the training scheduler and the sampling gate: turns by
tokens per tenant, not per run, no credit banked while idle, and the queue states a waiting future reports (the
shared-server probe's finding 10)."""

from __future__ import annotations

import asyncio
import threading

from tx.core.fairshare import MIN_COST, Candidate, FairShare
from tx.core.futures import FutureRegistry
from tx.core.sampling.gate import SamplingGate
from tx.core.scheduler import Job, Scheduler


def test_a_tenant_with_more_runs_gets_no_more_tokens() -> None:
    fair = FairShare()
    served = {"a": 0.0, "b": 0.0}
    for _ in range(400):  # a: 8 runs of 800-token steps, always ready; b: one run of 100-token steps
        ready = [Candidate("a", f"a{i}", 800) for i in range(8)] + [Candidate("b", "b0", 100)]
        picked = fair.pick(ready)
        assert picked is not None
        fair.charge(picked)
        served[picked.tenant] += picked.cost
    assert abs(served["a"] - served["b"]) / served["b"] < 0.05


def test_a_tenants_runs_take_turns_and_idle_banks_nothing() -> None:
    fair = FairShare()
    order = []
    for _ in range(6):
        picked = fair.pick([Candidate("a", "r1", 100), Candidate("a", "r2", 100)])
        assert picked is not None
        fair.charge(picked)
        order.append(picked.key)
    assert order == ["r1", "r2"] * 3
    for _ in range(10):  # b was away while a trained: on its return it shares, it does not catch up
        fair.charge(Candidate("a", "r1", 100))
    picks = []
    for _ in range(6):
        picked = fair.pick([Candidate("a", "r1", 100), Candidate("b", "r1", 100)])
        assert picked is not None
        fair.charge(picked)
        picks.append(picked.tenant)
    assert picks.count("a") == 3 and MIN_COST > 0


def test_the_scheduler_serves_the_light_tenant_between_the_heavy_ones_steps() -> None:
    """Tenant a queues 8 runs x 4 steps of 8x tenant b's tokens before the thread starts; b's 4 steps run
    interleaved, not after a's 32."""

    async def run() -> list[str]:
        futures = FutureRegistry(asyncio.get_running_loop(), ttl_s=60)
        scheduler = Scheduler(futures, gap_timeout_s=60)
        ran: list[str] = []
        lock = threading.Lock()
        for tenant, runs, cost in (("a", 8, 800.0), ("b", 1, 100.0)):
            for r in range(runs):
                model = f"{tenant}{r}"
                scheduler.add_model(model, tenant=tenant)
                for seq in range(1, 5):
                    future, _ = futures.create(tenant, "ForwardBackward")

                    def step(name: str = tenant) -> None:
                        with lock:
                            ran.append(name)

                    scheduler.submit(model, seq, Job(future, step, cost=cost, size=10))
        assert scheduler.queued_bytes("a") == 320 and scheduler.usage()["b"] == (4, 40)
        scheduler.start()
        while len(ran) < 36:
            await asyncio.sleep(0.01)
        scheduler.stop(5)
        return ran

    ran = asyncio.run(run())
    assert max(i for i, tenant in enumerate(ran) if tenant == "b") < 8  # b's 4 steps are done early


def test_a_waiting_jobs_future_says_why() -> None:
    async def run() -> tuple[str, str, str | None]:
        futures = FutureRegistry(asyncio.get_running_loop(), ttl_s=60)
        scheduler = Scheduler(futures, gap_timeout_s=60)
        release = threading.Event()
        made = {}
        for model, tenant in (("a1", "a"), ("a2", "a"), ("b1", "b")):
            scheduler.add_model(model, tenant=tenant)
            made[model], _ = futures.create(tenant, "ForwardBackward")
            scheduler.submit(model, 1, Job(made[model], release.wait, cost=100))
        scheduler.start()
        while not any(f.started_at for f in made.values()):
            await asyncio.sleep(0.01)
        first = next(m for m, f in made.items() if f.started_at)
        states = (first, made["a2" if first == "a1" else "a1"].queue_state, made["b1"].queue_state_reason)
        release.set()
        scheduler.stop(5)
        return states

    first, sibling, reason = asyncio.run(run())
    assert first == "a1" and sibling == "paused_rate_limit" and reason and "another key's work" in reason


def test_the_gate_lets_the_waiting_tenant_through_before_the_burst() -> None:
    async def run() -> list[str]:
        gate = SamplingGate(capacity=4)
        order: list[str] = []

        async def sample(tenant: str, rows: int) -> None:
            await gate.acquire(tenant, rows, rows * 100.0)
            order.append(tenant)
            await asyncio.sleep(0.01)
            gate.release(tenant, rows)

        burst = [asyncio.create_task(sample("a", 2)) for _ in range(16)]
        await asyncio.sleep(0)  # a's burst is queued first
        light = [asyncio.create_task(sample("b", 2)) for _ in range(2)]
        await asyncio.gather(*burst, *light)
        assert gate.rows_in_flight == 0 and gate.usage() == {}
        return order

    order = asyncio.run(run())
    assert max(i for i, tenant in enumerate(order) if tenant == "b") < 6
