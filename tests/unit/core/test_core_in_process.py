"""tx/core in-process: the scheduler, futures and the training service over a real SQLite store and
FakeBackend (tests/fake_backend.py), with no server start. A scheduler bug reproduces here in ms."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from fake_backend import BASE, FakeBackend

from tx.backends.base import TrainingBackend
from tx.core.checkpoints.downloads import DownloadSigner
from tx.core.checkpoints.files import CheckpointFiles
from tx.core.futures import Future, FutureRegistry
from tx.core.scheduler import Scheduler
from tx.core.services import build_services
from tx.optimizers import AdamParams
from tx.store.store import Store
from tx.store.tables import TrainingRunRow
from tx.types import Datum as DomainDatum
from tx.types import (
    ErrorCategory,
    ForwardBackwardInput,
    LoraConfig,
    ModelInput,
    NotFoundError,
    ProvenanceSpan,
    SampledSequence,
    StopReason,
    UserError,
)

OWNER = "owner-a"


class Core:
    """The core as `tx serve` wires it, minus HTTP and engines."""

    def __init__(self, tmp_path: Path, gap_timeout_s: float) -> None:
        self.backend = FakeBackend()
        self.store = Store.from_url(f"sqlite:///{tmp_path / 'tx.db'}")
        self.futures = FutureRegistry(asyncio.get_running_loop(), ttl_s=3600)
        self.scheduler = Scheduler(self.futures, gap_timeout_s)
        self.service = build_services(self.store, self.backend, self.futures, self.scheduler,
                                      CheckpointFiles(tmp_path / "checkpoints"), DownloadSigner(b"k" * 32, 3600))
        self.scheduler.start()

    def close(self) -> None:
        self.scheduler.stop(5)
        self.service.recorder.close()
        self.store.close()

    async def done(self, future: Future, timeout_s: float = 10.0) -> Future:
        finished = await self.futures.wait(future.request_id, future.owner, timeout_s)
        assert finished.done, f"{future.kind} did not finish in {timeout_s} s"
        return finished

    async def new_model(self) -> str:
        session = self.service.sessions.create(OWNER, None, [], {})
        created = await self.done(self.service.runs.create(OWNER, session, 0, BASE, LoraConfig(rank=4), None))
        assert created.failure is None, created.failure
        return created.result.model_id

    def forward_backward(self, model_id: str, seq_id: int, tokens: tuple[int, ...] = (1, 2, 3)) -> Future:
        datum = DomainDatum(ModelInput.from_tokens(tokens), {"target_tokens": np.array(tokens[1:] + (0,))})
        batch = ForwardBackwardInput([datum], "cross_entropy")
        return self.service.training.forward_backward(OWNER, model_id, seq_id, batch)


def run(tmp_path: Path, scenario: Callable[[Core], Awaitable[None]], gap_timeout_s: float = 30.0) -> None:
    async def main() -> None:
        core = Core(tmp_path, gap_timeout_s)
        try:
            await scenario(core)
        finally:
            core.close()

    asyncio.run(main())


def test_the_fake_implements_the_whole_backend_interface() -> None:
    assert issubclass(FakeBackend, TrainingBackend) and not FakeBackend.__abstractmethods__


def test_jobs_run_in_seq_id_order_whatever_order_they_arrive_in(tmp_path: Path) -> None:
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        core.backend.release.clear()  # hold the trainer while all three arrive
        third = core.service.training.optim_step(OWNER, model, 3, AdamParams(learning_rate=0.5))
        second = core.forward_backward(model, 2)
        first = core.service.training.optim_step(OWNER, model, 1, AdamParams(learning_rate=0.25))
        core.backend.release.set()
        for future in (first, second, third):
            assert (await core.done(future)).failure is None
        assert [c for c, _ in core.backend.calls[1:]] == ["optim_step", "forward_backward", "optim_step"]
        assert second.result.metrics["loss:sum"] == pytest.approx(0.25 * 3)  # saw the first step only

    run(tmp_path, scenario)


def test_a_runs_last_request_time_is_written_at_most_once_a_second(tmp_path: Path) -> None:
    """Each queued call moved last_request_time with a store commit: two per training step. Now the first
    call of a run writes it, calls within `touch_every_s` after do not, and the next one after does."""
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        writes: list[str] = []
        touch = core.store.touch_run
        core.store.touch_run = lambda run_id: (writes.append(run_id), touch(run_id))[1]  # type: ignore[method-assign]
        created = core.store.get_run(model, OWNER).last_request_time
        sequencer = core.service.training.sequencer
        sequencer.touch_every_s = 0.5
        await core.done(core.forward_backward(model, 1))
        first = core.store.get_run(model, OWNER).last_request_time
        assert first > created and writes == [model]
        for seq_id in (2, 3):
            await core.done(core.service.training.optim_step(OWNER, model, seq_id, AdamParams(learning_rate=0.1)))
        assert writes == [model] and core.store.get_run(model, OWNER).last_request_time == first
        time.sleep(0.5)
        await core.done(core.forward_backward(model, 4))
        assert writes == [model, model] and core.store.get_run(model, OWNER).last_request_time > first

    run(tmp_path, scenario)


def test_a_refused_submission_frees_its_seq_id_at_once(tmp_path: Path) -> None:
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        with pytest.raises(UserError, match="learning_rate"):
            core.service.training.optim_step(OWNER, model, 1, AdamParams(learning_rate=-1.0))
        core.service.sequencer.reject(OWNER, model, 1)  # what the route does with a refused call
        started = time.monotonic()
        assert (await core.done(core.forward_backward(model, 2), timeout_s=5)).failure is None
        assert time.monotonic() - started < 5  # the gap timeout is 30 s

    run(tmp_path, scenario)


@pytest.mark.parametrize("tokens, refusal", [
    ((1,) * 65, "datum 0: 65 tokens exceed the maximum context length 64"),
    ((1, 2, 100), r"datum 0: token id 100 is outside the vocabulary \[0, 100\)"),
])
def test_a_batch_that_can_never_run_is_refused_before_it_has_a_future(
    tmp_path: Path, tokens: tuple[int, ...], refusal: str
) -> None:
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        with pytest.raises(UserError, match=refusal):
            core.forward_backward(model, 1, tokens)
        core.service.sequencer.reject(OWNER, model, 1)  # what the route does with a refused call
        started = time.monotonic()
        assert (await core.done(core.forward_backward(model, 2), timeout_s=5)).failure is None
        assert time.monotonic() - started < 5  # the gap timeout is 30 s
        assert [c for c, _ in core.backend.calls].count("forward_backward") == 1  # the trainer never saw it

    run(tmp_path, scenario)


def test_another_owner_cannot_free_a_seq_id(tmp_path: Path) -> None:
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        core.service.sequencer.reject("someone-else", model, 1)
        late = core.forward_backward(model, 2)
        assert not (await core.futures.wait(late.request_id, OWNER, 0.3)).done  # still waits for seq 1

    run(tmp_path, scenario)


def test_a_runs_row_is_read_once_and_still_refused_to_another_owner(tmp_path: Path) -> None:
    """The training path reads a run's row from the store once (it was ~0.4 ms of ORM per call); after that,
    another key's calls on the run are refused as before (404, the run not even named as existing) and may
    not free its seq_ids, and an unknown run is still a 404."""
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        reads: list[str] = []
        get_run = core.store.get_run

        def counted(run_id: str, owner: str) -> TrainingRunRow:
            reads.append(run_id)
            return get_run(run_id, owner)

        core.store.get_run = counted  # type: ignore[method-assign]
        await core.done(core.forward_backward(model, 1))
        await core.done(core.service.training.optim_step(OWNER, model, 2, AdamParams(learning_rate=0.1)))
        await core.done(core.forward_backward(model, 3))
        assert reads == [model]
        datum = DomainDatum(ModelInput.from_tokens((1, 2)), {"target_tokens": np.array([2, 0])})
        batch = ForwardBackwardInput([datum], "cross_entropy")
        with pytest.raises(NotFoundError, match=f"training run {model!r} not found"):
            core.service.training.forward_backward("someone-else", model, 4, batch)
        with pytest.raises(NotFoundError, match="not found"):
            core.service.training.optim_step("someone-else", model, 4, AdamParams(learning_rate=0.1))
        core.service.sequencer.reject("someone-else", model, 4)
        late = core.forward_backward(model, 5)
        assert not (await core.futures.wait(late.request_id, OWNER, 0.3)).done  # still waits for seq 4
        with pytest.raises(NotFoundError, match="not found"):
            core.forward_backward(model + "-unknown", 1)

    run(tmp_path, scenario)


def test_a_call_queues_in_memory_only_while_it_needs_no_store(tmp_path: Path) -> None:
    """optim_step's route queues on the event loop (no thread hop) only when the call needs no store: the run's
    row kept and no last_request_time write due within the margin; otherwise it goes through a worker thread."""
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        sequencer = core.service.sequencer
        sequencer.touch_every_s = 0.5
        assert not sequencer.queues_in_memory(model)  # its row not read yet
        await core.done(core.forward_backward(model, 1))
        assert sequencer.queues_in_memory(model)  # row kept, last_request_time just written
        assert not sequencer.queues_in_memory(model + "-other")
        await asyncio.sleep(0.45)  # within TOUCH_MARGIN_S of the next write
        assert not sequencer.queues_in_memory(model)
        await asyncio.sleep(0.1)  # the write is due: the next call (in a worker thread, by the route) makes it
        await core.done(core.service.training.optim_step(OWNER, model, 2, AdamParams(learning_rate=0.1)))
        assert sequencer.queues_in_memory(model)

    run(tmp_path, scenario)


def test_a_gap_is_skipped_after_the_timeout_and_the_late_call_fails(tmp_path: Path) -> None:
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        assert (await core.done(core.forward_backward(model, 2))).failure is None
        late = await core.done(core.forward_backward(model, 1))
        assert late.failure is not None and "skipped" in late.failure.message

    run(tmp_path, scenario, gap_timeout_s=0.2)


def test_a_resubmitted_seq_id_answers_with_the_original_future(tmp_path: Path) -> None:
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        first = core.forward_backward(model, 1)
        assert core.forward_backward(model, 1) is first
        await core.done(first)
        assert [c for c, _ in core.backend.calls].count("forward_backward") == 1

    run(tmp_path, scenario)


def test_failures_carry_their_category(tmp_path: Path) -> None:
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        core.backend.failures = [UserError("a datum only the trainer refuses"), RuntimeError("the trainer broke")]
        user = await core.done(core.forward_backward(model, 1))
        server = await core.done(core.forward_backward(model, 2))
        assert user.failure.category is ErrorCategory.USER and "only the trainer" in user.failure.message
        assert server.failure.category is ErrorCategory.SERVER and "RuntimeError" in server.failure.message
        assert (await core.done(core.forward_backward(model, 3))).failure is None  # the queue goes on

    run(tmp_path, scenario)


def test_a_saved_state_loads_into_a_new_run(tmp_path: Path) -> None:
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        await core.done(core.service.training.optim_step(OWNER, model, 1, AdamParams(learning_rate=0.75)))
        saved = await core.done(core.service.checkpoints.save_weights(OWNER, model, 2, "step-1", None, False, None))
        session = core.service.sessions.create(OWNER, None, [], {})
        loaded = await core.done(core.service.runs.create_from_checkpoint(OWNER, session, 0, saved.result.path, True))
        assert loaded.failure is None, loaded.failure
        assert core.backend.weights[loaded.result.model_id] == pytest.approx(0.75)

    run(tmp_path, scenario)



def test_both_ways_of_loading_a_checkpoint_are_audited(tmp_path: Path) -> None:
    """Regression: TrainingClient.load_state left no checkpoint_read entry (create_from_checkpoint did)."""
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        saved = await core.done(core.service.checkpoints.save_weights(OWNER, model, 1, "step-1", None, False, None))
        path = saved.result.path
        await core.done(core.service.training.load_state(OWNER, model, 2, path, True))
        session = core.service.sessions.create(OWNER, None, [], {})
        await core.done(core.service.runs.create_from_checkpoint(OWNER, session, 0, path, False))
        today = datetime.now(timezone.utc).date()
        reads = [e for e in core.service.audit.day(OWNER, False, today, "checkpoints") if e.event == "checkpoint_read"]
        assert [(e.tinker_path, e.details["purpose"]) for e in reads] == [(path, "load"), (path, "load")]

    run(tmp_path, scenario)

def test_stable_reinforce_trains_on_the_records_its_provenance_names(tmp_path: Path) -> None:
    """A stable_reinforce batch reaches the trainer with the recorded logprobs at its sampled rows (whatever the
    client sent), and restarts each record's day; one naming a missing, foreign or false record is refused at
    submission, naming it."""
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        session = core.store.get_run(model, OWNER).session_id
        records = core.service.records
        ids = [f"{session}:sample:0:1:{i}" for i in range(2)]
        sampled = [SampledSequence([7, 8, 9], [-0.25, -0.5, -0.75], StopReason.LENGTH)] * 2
        records.record(OWNER, session, f"{session}:sample:0", BASE, 1, 3, ids, sampled)

        def batch(sequence_id: str, targets: tuple[int, ...] = (5, 7, 8, 9)) -> ForwardBackwardInput:
            spans = (ProvenanceSpan(sequence_id, 1, 1, sampled=False), ProvenanceSpan(sequence_id, 0, 3, sampled=True))
            datum = DomainDatum(ModelInput.from_tokens((4, 5, 7, 8)),
                                {"target_tokens": np.array(targets), "logprobs": np.full(4, -9.0, np.float32),
                                 "advantages": np.array([0.0, 1.0, 1.0, 1.0], np.float32)}, spans)
            return ForwardBackwardInput([datum], "stable_reinforce")

        refusals = [(batch("nope:0"), "no stability record of sequence_id 'nope:0'"),
                    (batch(ids[0], (5, 7, 6, 9)), f"target row 2 holds token 6, but sequence '{ids[0]}' sampled token 8")]
        for seq, (bad, refusal) in enumerate(refusals, start=1):
            with pytest.raises(UserError, match=refusal):
                core.service.training.forward_backward(OWNER, model, seq, bad)
            core.service.sequencer.reject(OWNER, model, seq)
        assert (await core.done(core.service.training.forward_backward(OWNER, model, 3, batch(ids[0])))).failure is None
        (trained,) = core.backend.batches
        assert trained.data[0].loss_fn_inputs["logprobs"].tolist() == [-9.0, -0.25, -0.5, -0.75]
        used, unused = (core.store.stability.get(OWNER, [i])[0].last_used_at for i in ids)
        assert used > unused  # the training request restarted its record's day

        other = await core.new_model()  # a model of another session
        with pytest.raises(UserError, match=f"'{ids[1]}' was sampled in another session"):
            core.service.training.forward_backward(OWNER, other, 1, batch(ids[1]))

    run(tmp_path, scenario)
