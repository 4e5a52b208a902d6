"""Quota holds follow what the trainer holds, under any sequence of creates (new, resent after their future was
dropped, cancelled at once, from a checkpoint, into a slot a copy took), weights copied into the session's slots,
sessions ending, the futures being forgotten and the server restarting (a new core over the same store, the
trainer's memory gone): after each step settles, a key's usage (runs, LoRA ranks summed) equals the runs the
trainer has loaded for it. The core in-process over a real SQLite store and FakeBackend (tests/fake_backend.py);
hypothesis draws the sequences."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from fake_backend import BASE, FakeBackend
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tx.core.checkpoints.copies import CopyTarget
from tx.core.checkpoints.downloads import DownloadSigner
from tx.core.checkpoints.files import CheckpointFiles
from tx.core.futures import Future, FutureRegistry
from tx.core.quotas import QuotaLimits
from tx.core.scheduler import Scheduler
from tx.core.services import build_services
from tx.store.store import Store
from tx.types import ConflictError, LoraConfig, NotFoundError, UserError

OWNER = "owner-holds"
STEPS = st.lists(st.one_of(
    st.tuples(st.just("create"), st.integers(0, 3), st.sampled_from([2, 4, 8])),
    st.tuples(st.just("create_and_cancel"), st.integers(0, 3), st.sampled_from([2, 4, 8])),
    st.tuples(st.just("resume"), st.integers(0, 3)),  # create_training_client_from_state: the source's rank 4
    st.tuples(st.just("copy"), st.integers(0, 3)),  # copy_weights into that slot: a run row, nothing loaded
    st.tuples(st.just("restart")),
    st.tuples(st.just("forget_futures")),
    st.tuples(st.just("end_session")),
), min_size=1, max_size=12)


class Server:
    """One life of the server: the core over the store, its own trainer (FakeBackend) and scheduler."""

    def __init__(self, store: Store, root: Path) -> None:
        self.backend = FakeBackend()
        self.futures = FutureRegistry(asyncio.get_running_loop(), ttl_s=3600)
        self.scheduler = Scheduler(self.futures, 30.0)
        self.core = build_services(store, self.backend, self.futures, self.scheduler, CheckpointFiles(root / "checkpoints"),
                                   DownloadSigner(b"k" * 32, 3600), limits=QuotaLimits(runs=3, lora_rank=12))
        self.scheduler.start()
        self.made: list = []

    async def result(self, future: Future) -> Any:
        finished = await self.futures.wait(future.request_id, OWNER, 10)
        assert finished.done and finished.failure is None, finished.failure
        return finished.result

    def stop(self) -> None:
        self.scheduler.stop(5)
        self.core.recorder.close()


async def source_checkpoint(server: Server) -> str:
    """A rank-4 run's saved weights, its session ended (so it holds nothing)."""
    session = server.core.sessions.create(OWNER, None, [], {})
    model = (await server.result(server.core.runs.create(OWNER, session, 0, BASE, LoraConfig(rank=4), None))).model_id
    saved = await server.result(server.core.checkpoints.save_weights(OWNER, model, 1, "source", None, False, None))
    server.core.sessions.finish(OWNER, session, "success")
    return saved.path


async def drive(steps: list[tuple], root: Path) -> None:
    store = Store.from_url(f"sqlite:///{root / 'tx.db'}")
    server = Server(store, root)
    try:
        source = await source_checkpoint(server)
        session = server.core.sessions.create(OWNER, None, [], {})
        for step in steps:
            try:
                session = await take(server, step, session, source)
                if step[0] == "restart":
                    server.stop()
                    server = Server(store, root)
            except (UserError, ConflictError, NotFoundError):
                pass  # a quota, a conflict, a request already running: refused, holding nothing
            for future in server.made:
                if not future.done:  # a forgotten one was done
                    await server.futures.wait(future.request_id, OWNER, 10)
            loaded = await _settled(server.backend, server.core.runs.usage)
            usage = server.core.runs.usage().get(OWNER, (0, 0))
            assert usage == (len(loaded), sum(loaded.values())), (step, usage, loaded)
    finally:
        server.stop()
        store.close()


async def take(server: Server, step: tuple, session: str, source: str) -> str:
    """One step of the sequence; the session the next step uses."""
    core, kind = server.core, step[0]
    if kind in ("create", "create_and_cancel"):
        future = core.runs.create(OWNER, session, step[1], BASE, LoraConfig(rank=step[2]), None)
        server.made.append(future)
        if kind == "create_and_cancel":
            server.futures.cancel(future.request_id, OWNER)
    elif kind == "resume":
        server.made.append(core.runs.create_from_checkpoint(OWNER, session, step[1], source, with_optimizer=False))
    elif kind == "copy":
        core.copies.copy(OWNER, source, CopyTarget(session_id=session, model_seq_id=step[1]), None, None)
    elif kind == "forget_futures":
        server.futures.forget([f.request_id for f in server.made if f.done], OWNER)
    elif kind == "end_session":
        core.sessions.finish(OWNER, session, "success")
        return core.sessions.create(OWNER, None, [], {})
    return session


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
