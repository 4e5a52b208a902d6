"""Quota holds follow what the trainer holds, under any sequence of creates (new, resent after their future was
dropped, cancelled at once), sessions ending and the futures being forgotten: after each step settles, a key's
usage (runs, LoRA ranks summed) equals the runs the trainer has loaded for it. The core in-process over a real
SQLite store and FakeBackend (tests/fake_backend.py); hypothesis draws the sequences."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from fake_backend import BASE, FakeBackend
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tx.core.checkpoints.downloads import DownloadSigner
from tx.core.checkpoints.files import CheckpointFiles
from tx.core.futures import FutureRegistry
from tx.core.quotas import QuotaLimits
from tx.core.scheduler import Scheduler
from tx.core.services import build_services
from tx.store.store import Store
from tx.types import ConflictError, LoraConfig, NotFoundError, UserError

OWNER = "owner-holds"
STEPS = st.lists(st.one_of(
    st.tuples(st.just("create"), st.integers(0, 3), st.sampled_from([2, 4, 8])),
    st.tuples(st.just("create_and_cancel"), st.integers(0, 3), st.sampled_from([2, 4, 8])),
    st.tuples(st.just("forget_futures")),
    st.tuples(st.just("end_session")),
), min_size=1, max_size=12)


async def drive(steps: list[tuple], root: Path) -> None:
    backend = FakeBackend()
    store = Store.from_url(f"sqlite:///{root / 'tx.db'}")
    futures = FutureRegistry(asyncio.get_running_loop(), ttl_s=3600)
    scheduler = Scheduler(futures, 30.0)
    core = build_services(store, backend, futures, scheduler, CheckpointFiles(root / "checkpoints"),
                          DownloadSigner(b"k" * 32, 3600), limits=QuotaLimits(runs=3, lora_rank=12))
    scheduler.start()
    session = core.sessions.create(OWNER, None, [], {})
    made = []
    try:
        for step in steps:
            try:
                if step[0] in ("create", "create_and_cancel"):
                    future = core.runs.create(OWNER, session, step[1], BASE, LoraConfig(rank=step[2]), None)
                    made.append(future)
                    if step[0] == "create_and_cancel":
                        futures.cancel(future.request_id, OWNER)
                elif step[0] == "forget_futures":
                    futures.forget([f.request_id for f in made if f.done], OWNER)
                else:
                    core.sessions.finish(OWNER, session, "success")
                    session = core.sessions.create(OWNER, None, [], {})
            except (UserError, ConflictError, NotFoundError):
                pass  # a quota, a conflict, a request already running: refused, holding nothing
            for future in made:
                if not future.done:  # a forgotten one was done
                    await futures.wait(future.request_id, OWNER, 10)
            loaded = await _settled(backend, core.runs.usage)
            usage = core.runs.usage().get(OWNER, (0, 0))
            assert usage == (len(loaded), sum(loaded.values())), (step, usage, loaded)
    finally:
        scheduler.stop(5)
        core.recorder.close()
        store.close()


async def _settled(backend: FakeBackend, usage) -> dict[str, int]:
    """{model id: LoRA rank} of the runs the trainer holds, once the unloads a finished session queued ran
    (they run on the training thread after the session's holds were dropped)."""
    for _ in range(40):
        loaded = {model_id: lora.rank for model_id, (_base, lora) in dict(backend.bases).items()}
        if usage().get(OWNER, (0, 0)) == (len(loaded), sum(loaded.values())):
            break
        await asyncio.sleep(0.05)
    return loaded


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
def test_usage_always_equals_what_the_trainer_holds(steps: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(drive(steps, Path(root)))
