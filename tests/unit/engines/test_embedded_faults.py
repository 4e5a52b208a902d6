"""No request left waiting: a step of the embedded engine that fails answers every request it touched with the
error, names the cause, and the engine keeps serving (docs/engines.md#the-embedded-engine).

The real `Scheduler` and `Weights` on the tiny model, in this process. Each test injects one fault: `fault_once`
is fault injection, a fake that replaces the one method of the step under test and raises `InjectedFault` on its
first call (the calls after it run the real method), so the request after the fault must be served as usual.
The weight tests push real tensors of the wrong shape through a real gloo group instead (no fake).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch
from engine_weights import random_adapter

from tx.inference.engines.embedded import batch as batch_module
from tx.inference.engines.embedded.batch import RunningBatch
from tx.inference.engines.embedded.generate import DecodeBatch
from tx.inference.engines.embedded.scheduler import Scheduler
from tx.inference.engines.embedded.transfer import WeightReceiver
from tx.inference.engines.embedded.weights import Weights
from tx.inference.engines.http import detail_of
from tx.inference.engines.streaming import TokenStream
from tx.inference.protocol import EngineStats, GenerateRequest, LoraSpec, WeightsUpdateRequest
from tx.inference.weight_sync import BroadcastSender, TransferInit, free_port, plan_update

WAIT_S = 20.0
"""How long a failed request may take to be answered: a few steps of the tiny model, on a loaded machine."""
PROMPT = [5, 17, 230, 1000, 44]
LONG = 1500
"""A request this long is still decoding when the next one arrives."""
TARGETS = ["q_proj", "v_proj"]
SPEC = LoraSpec(r=4, lora_alpha=8, target_modules=TARGETS)


class InjectedFault(RuntimeError):
    """What a fault-injection fake raises."""


def fault_once(monkeypatch: pytest.MonkeyPatch, owner: object, name: str,
               when: Callable[..., bool] = lambda *args, **kwargs: True) -> threading.Event:
    """Fault injection: `owner.name` (a method of a class, or a function of a module) raises `InjectedFault` on its
    first call that `when` accepts, and runs as before otherwise; the event is set once it raised."""
    original = getattr(owner, name)
    fired = threading.Event()

    def faulty(*args, **kwargs):
        if not fired.is_set() and when(*args, **kwargs):
            fired.set()
            raise InjectedFault(f"injected fault in {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, faulty)
    return fired


@pytest.fixture(scope="module")
def weights(tiny_model_dir) -> Weights:
    return Weights(tiny_model_dir, max_adapters=2)


@pytest.fixture(scope="module")
def scheduler(weights) -> Iterator[Scheduler]:
    scheduler = Scheduler(weights, max_batch_size=8, batch_wait_s=0.0)
    scheduler.start()
    yield scheduler
    scheduler.close()


def request(max_tokens: int = 8, **options) -> GenerateRequest:
    return GenerateRequest(**{"prompt_token_ids": PROMPT, "max_tokens": max_tokens, "temperature": 0.0,
                              "stop_at_eos": False, **options})


def assert_failed_by(future: Future, cause: str, error: type[BaseException] = InjectedFault) -> None:
    """`future` failed with `error` naming `cause`, within WAIT_S (never left waiting)."""
    try:
        exc = future.exception(timeout=WAIT_S)
    except TimeoutError:
        pytest.fail(f"a request the failing step touched was left waiting ({cause})")
    assert isinstance(exc, error) and cause in str(exc), exc


def assert_serves(scheduler: Scheduler, **options) -> None:
    """The scheduler counts no request, and serves the next one as usual."""
    deadline = time.monotonic() + WAIT_S
    while scheduler.counts() != (0, 0):
        assert time.monotonic() < deadline, f"counts stayed {scheduler.counts()} after the fault"
        time.sleep(0.01)
    (seq,) = scheduler.submit(request(**options)).result(timeout=WAIT_S).sequences
    assert seq.stop_reason == "length" and len(seq.token_ids) == 8


def running(scheduler: Scheduler, **options) -> Future:
    """A long request, once it decodes."""
    future = scheduler.submit(request(LONG, **options))
    steps = scheduler.stats.num_decode_steps
    deadline = time.monotonic() + WAIT_S
    while scheduler.stats.num_decode_steps < steps + 2:
        assert time.monotonic() < deadline and not future.done(), "the long request never decoded"
        time.sleep(0.005)
    return future


# ---- the scheduler's steps


def test_a_prefill_that_fails_answers_the_requests_it_admitted(scheduler, monkeypatch):
    fault_once(monkeypatch, DecodeBatch, "prefill")
    futures = [scheduler.submit(request(n=n)) for n in (1, 2)]
    for future in futures:
        assert_failed_by(future, "injected fault in prefill")
    assert_serves(scheduler)


def test_a_prefill_that_fails_while_a_batch_runs_leaves_the_running_rows_be(scheduler, monkeypatch):
    long = running(scheduler)
    fault_once(monkeypatch, DecodeBatch, "prefill")
    assert_failed_by(scheduler.submit(request()), "injected fault in prefill")
    (seq,) = long.result(timeout=120).sequences
    assert seq.stop_reason == "length" and len(seq.token_ids) == LONG
    assert_serves(scheduler)


def test_an_admission_that_fails_while_joining_answers_the_batch_and_the_joining_request(scheduler, monkeypatch):
    long = running(scheduler)
    fault_once(monkeypatch, DecodeBatch, "merge")
    joining = scheduler.submit(request())
    assert_failed_by(joining, "injected fault in merge")
    assert_failed_by(long, "injected fault in merge")
    assert_serves(scheduler)


def test_prompt_scores_that_fail_answer_the_request(scheduler, monkeypatch):
    fault_once(monkeypatch, batch_module, "prompt_logprobs")
    assert_failed_by(scheduler.submit(request(prompt_logprobs=True)), "injected fault in prompt_logprobs")
    assert_serves(scheduler, prompt_logprobs=True)


def test_a_first_token_that_fails_to_sample_answers_the_requests(scheduler, monkeypatch):
    fault_once(monkeypatch, batch_module, "sample_next")
    futures = [scheduler.submit(request(temperature=t)) for t in (0.0, 1.0)]
    for future in futures:
        assert_failed_by(future, "injected fault in sample_next")
    assert_serves(scheduler)


def test_a_decode_step_that_fails_answers_every_running_request(scheduler, monkeypatch):
    long = running(scheduler)
    fault_once(monkeypatch, DecodeBatch, "step", when=lambda batch, *args: batch.num_rows == 2)  # once both run
    other = scheduler.submit(request(LONG))
    assert_failed_by(long, "injected fault in step")
    assert_failed_by(other, "injected fault in step")
    assert_serves(scheduler)


def test_a_row_selection_that_fails_answers_the_rows_left(scheduler, monkeypatch):
    long = running(scheduler)
    fault_once(monkeypatch, DecodeBatch, "select_rows")
    short = scheduler.submit(request(4))  # joins, finishes first: its row leaves (select_rows)
    assert len(short.result(timeout=WAIT_S).sequences[0].token_ids) == 4  # answered before the cache reorder
    assert_failed_by(long, "injected fault in select_rows")
    assert_serves(scheduler)


def test_dropping_cancelled_rows_that_fails_answers_the_batch(scheduler, monkeypatch):
    long = running(scheduler)
    fault_once(monkeypatch, RunningBatch, "drop_cancelled")
    assert_failed_by(long, "injected fault in drop_cancelled")
    assert_serves(scheduler)


def test_an_abort_that_fails_answers_the_batch_and_the_pause_returns(scheduler, monkeypatch):
    long = running(scheduler)
    fault_once(monkeypatch, RunningBatch, "abort", when=lambda self, only_adapters_gone=False: not only_adapters_gone)
    pause = threading.Thread(target=scheduler.pause, args=("abort",), daemon=True)
    pause.start()
    pause.join(WAIT_S)
    assert not pause.is_alive(), "the pause waited for a batch whose abort failed"
    assert_failed_by(long, "injected fault in abort")
    waiting = scheduler.submit(request())  # the contract queues while paused
    scheduler.resume()
    assert waiting.result(timeout=WAIT_S).sequences[0].stop_reason == "length"
    assert_serves(scheduler)


def test_a_listener_that_fails_answers_its_own_request_only(scheduler):
    def broken(index: int, token: int, logprob: float) -> None:
        raise ValueError("the listener's reader is gone")

    heard: list[int] = []
    plain = scheduler.submit(request(40))
    listened = scheduler.submit(request(40), listener=lambda index, token, logprob: heard.append(token))
    failing = scheduler.submit(request(40), listener=broken)
    assert_failed_by(failing, "the listener's reader is gone", ValueError)
    assert len(plain.result(timeout=WAIT_S).sequences[0].token_ids) == 40
    assert heard == listened.result(timeout=WAIT_S).sequences[0].token_ids
    assert_serves(scheduler)


# ---- weight loads: a push of tensors of the wrong shape through a real gloo group (no fake)


@pytest.fixture(scope="module")
def pusher(weights) -> Iterator[Callable[..., object]]:
    """`push(named, adapter)`: one update through the engine's real `WeightReceiver` over a gloo group with this
    process as the trainer (rank 0); what `WeightReceiver.update` returned, or raised."""
    init = TransferInit(backend="gloo", master_address="127.0.0.1", master_port=free_port(), world_size=2,
                        rank_offset=1, group_name=f"test-{uuid.uuid4().hex}", timeout_s=60)
    receiver = WeightReceiver(weights)
    receiver.init(init)
    sender = BroadcastSender(init)
    sender.connect()

    def push(named, adapter: str):
        update = plan_update(named, bucket_bytes=1 << 14)
        body = WeightsUpdateRequest(transfer=update, adapter=adapter, lora=SPEC)
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(receiver.update, body)
            sender.send(named, update)
            return answer.exception(timeout=WAIT_S) or answer.result()

    yield push
    sender.close()
    receiver.close()


def adapter_tensors(reference_model, seed: int, misshapen: bool = False) -> list[tuple[str, torch.Tensor]]:
    """A random adapter's tensors; `misshapen`: its second tensor one column short (a fault the load meets after
    loading the first)."""
    _, named = random_adapter(reference_model, seed, r=SPEC.r, lora_alpha=SPEC.lora_alpha, targets=TARGETS)
    if misshapen:
        name, tensor = named[1]
        named[1] = (name, tensor[:, :-1].contiguous())
    return named


def test_an_adapter_load_that_fails_midway_answers_the_push_and_loads_nothing(scheduler, weights, pusher,
                                                                               reference_model):
    error = pusher(adapter_tensors(reference_model, 1, misshapen=True), "broken")
    assert isinstance(error, RuntimeError) and "size mismatch" in str(error), error
    assert not weights.has_adapter("broken"), "a half-loaded adapter was left to sample from"
    assert not isinstance(pusher(adapter_tensors(reference_model, 1), "broken"), BaseException)  # same group
    assert_serves(scheduler, adapter="broken")
    assert_serves(scheduler)
    weights.delete_adapter("broken")


def test_an_update_in_place_that_fails_ends_the_requests_generating_with_it(scheduler, weights, pusher,
                                                                            reference_model):
    assert not isinstance(pusher(adapter_tensors(reference_model, 2), "live"), BaseException)
    long = running(scheduler, adapter="live")
    error = pusher(adapter_tensors(reference_model, 3, misshapen=True), "live")
    assert isinstance(error, RuntimeError) and "size mismatch" in str(error), error
    (seq,) = long.result(timeout=WAIT_S).sequences
    assert seq.stop_reason == "abort" and len(seq.token_ids) < LONG, "it went on with half-replaced weights"
    assert not weights.has_adapter("live")
    assert_serves(scheduler)


# ---- the error names its cause, on both generate routes


def test_a_failed_stream_ends_with_an_error_event_naming_the_cause():
    """The stream route's last line, for a request a step failed after its first line (`TokenStream`), says what
    the plain route's 500 says: the error's type and message."""
    cause = InjectedFault("injected fault in step")

    async def events() -> list:
        stream, future = TokenStream(), Future()
        stream.finish_with(future)
        stream.listener(0, 7, -1.0)
        future.set_exception(cause)
        return [event async for event in stream.events()]

    *deltas, last = asyncio.run(events())
    assert [d.token_ids for event in deltas for d in event.deltas] == [[7]]
    assert (last.error_status, last.error_detail) == (500, "InjectedFault: injected fault in step")
    assert detail_of(cause) == last.error_detail


def test_a_row_whose_adapter_is_unloaded_between_two_steps_ends_with_abort(tiny_model_dir, reference_model):
    """The scheduler ends the rows of an unloaded adapter before each step, but a load that fails (or a delete)
    on another thread can unload it after that look: the step then raised "adapter is not loaded" and failed
    the whole batch (seen as a flaky test_an_update_in_place_that_fails_...). The step itself now ends them."""
    weights = Weights(tiny_model_dir, max_adapters=1)
    _, tensors = random_adapter(reference_model, 0, SPEC.r, SPEC.lora_alpha, TARGETS)
    weights.load_adapter("gone", SPEC, dict(tensors))
    stats = EngineStats()
    batch = RunningBatch(weights, stats)
    job = batch_module.Job(request(max_tokens=50, adapter="gone"))
    other = batch_module.Job(request(max_tokens=3))
    with torch.inference_mode():
        batch.admit([job, other])
        weights.delete_adapter("gone")  # as a failed load on the receiver's thread does
        while batch.rows:
            batch.step()
    (seq,) = job.future.result(timeout=1).sequences
    assert seq.stop_reason == "abort" and len(seq.token_ids) == 1
    assert other.future.result(timeout=1).sequences[0].stop_reason == "length"
    assert stats.num_decode_steps == 2
