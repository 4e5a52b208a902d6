"""The torch trainer on 2 worker processes (gloo; base held whole or sharded with FSDP2) against the in-process
trainer."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from backend_helpers import TINY_NAME, ce, core_reference, sft_data, snapshot

from tx.backends.torch.model import load_causal_lm
from tx.backends.torch.workers import create_workers_backend
from tx.backends.torch.workers.messages import Request, WireDatum
from tx.backends.torch.workers.policy import base_bytes, too_big
from tx.backends.torch.workers.shares import split_by_tokens
from tx.config.sections import TrainerSection
from tx.inference.manager.selfcheck import check_prompts
from tx.models.agreement import FLOAT32_TOLERANCE
from tx.optimizers import AdamParams
from tx.types import (
    Datum,
    ImageAssetPointer,
    ImageChunk,
    LoraConfig,
    ModelInput,
    NotFoundError,
    ProvenanceSpan,
    TextChunk,
    UserError,
)

LORA = LoraConfig(rank=4, seed=3)
# Uneven lengths, so the workers' shares differ; 3 datums over 2 workers
DATA = sft_data(seed=0, count=2, length=17) + sft_data(seed=1, count=1, length=9)
STEPS = [
    AdamParams(learning_rate=5e-3),
    AdamParams(learning_rate=5e-3, grad_clip_norm=0.5),
    AdamParams(learning_rate=5e-3, weight_decay=0.1),
]


@pytest.fixture(scope="module", params=["never", "always"], ids=["replicated", "sharded"])
def workers(tiny_model_dir, request):
    """2 workers holding the base whole (the default on CPU) or sharding it with FSDP2, with micro-batches of at
    most 20 tokens: rank 0's share of DATA (16 tokens) takes one pass and rank 1's (16 + 8) two, so a sharded
    rank 0 pads with an idle pass (the in-process trainer runs DATA in one)."""
    settings = TrainerSection(micro_batch_tokens=20, shard_base=request.param)
    backend = create_workers_backend({TINY_NAME: tiny_model_dir}, 2, device="cpu", threads=1, trainer=settings)
    yield backend
    backend.close()


def run_steps(backend, model_id, steps=STEPS):
    """(loss, grad_norm) of each step, and the forward_only logprobs after them."""
    history = []
    for adam in steps:
        loss = backend.forward_backward(model_id, ce(DATA)).metrics["loss:sum"]
        history.append((loss, backend.optim_step(model_id, adam).metrics["grad_norm"]))
    logprobs = [
        o["logprobs"] for o in backend.forward_backward(model_id, ce(DATA, forward_only=True)).loss_fn_outputs
    ]
    return history, logprobs


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=0, msg=name)


def test_two_workers_train_exactly_like_one_process(backend, workers):
    backend.create_model("one", TINY_NAME, LORA)
    workers.create_model("two", TINY_NAME, LORA)
    assert_same_weights(snapshot(backend, "one"), dict(workers.iter_trainable_weights("two")))

    one, one_logprobs = run_steps(backend, "one")
    two, two_logprobs = run_steps(workers, "two")

    np.testing.assert_allclose(np.array(two), np.array(one), atol=1e-5, rtol=1e-6)
    assert one[-1][0] < one[0][0]  # it learns
    assert [lp.shape for lp in two_logprobs] == [lp.shape for lp in one_logprobs]
    for a, b in zip(one_logprobs, two_logprobs):
        np.testing.assert_allclose(b, a, atol=1e-5)
    assert_same_weights(snapshot(backend, "one"), dict(workers.iter_trainable_weights("two")))
    workers.delete_model("two")
    assert not workers.has_model("two")


def test_checkpoints_cross_load_between_one_and_two_workers(backend, workers, tmp_path):
    backend.create_model("one", TINY_NAME, LORA)
    workers.create_model("two", TINY_NAME, LORA)
    run_steps(backend, "one", STEPS[:2])
    backend.save_state("one", tmp_path / "from-one")
    workers.load_state("two", tmp_path / "from-one", with_optimizer=True)  # 1 -> 2
    workers.save_state("two", tmp_path / "from-two")
    backend.create_model("again", TINY_NAME, LoraConfig(rank=4, seed=9))
    backend.load_state("again", tmp_path / "from-two", with_optimizer=True)  # 2 -> 1

    expected, _ = run_steps(backend, "one", STEPS[2:])
    np.testing.assert_allclose(
        np.array(run_steps(workers, "two", STEPS[2:])[0]), np.array(expected), atol=1e-5
    )
    np.testing.assert_allclose(
        np.array(run_steps(backend, "again", STEPS[2:])[0]), np.array(expected), atol=1e-5
    )

    workers.save_sampler_weights("two", tmp_path / "sampler")
    assert {p.name for p in (tmp_path / "sampler").iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    with pytest.raises(UserError, match="LoRA config"):
        workers.create_model("other", TINY_NAME, LoraConfig(rank=8, seed=0))
        workers.load_state("other", tmp_path / "from-one", with_optimizer=False)


def test_a_step_some_workers_have_no_gradients_for_matches_one_process(backend, workers):
    """One datum: one worker accumulates nothing; an optim_step with no forward_backward before it moves nothing."""
    backend.create_model("one", TINY_NAME, LORA)
    workers.create_model("partial", TINY_NAME, LORA)
    for model, trainer in (("one", backend), ("partial", workers)):
        trainer.forward_backward(model, ce(DATA[:1]))
        trainer.optim_step(model, STEPS[0])
        assert trainer.optim_step(model, STEPS[0]).metrics["grad_norm"] == 0.0
    assert_same_weights(snapshot(backend, "one"), dict(workers.iter_trainable_weights("partial")))
    workers.delete_model("partial")


def test_several_runs_in_one_call_train_exactly_like_one_process(backend, workers):
    """forward_backward_many on 2 workers (held whole: the runs share each worker's passes; sharded: each run its
    own) against each run alone in one process; a refused call fails alone, a one-datum call leaves a worker idle."""
    loras = [LORA, LoraConfig(rank=2, seed=4, train_mlp=False)]
    for i, lora in enumerate(loras):
        backend.create_model(f"one-{i}", TINY_NAME, lora)
        workers.create_model(f"many-{i}", TINY_NAME, lora)
    try:
        for data in (DATA, DATA[:1]):
            calls = [(f"many-{i}", ce(data)) for i in range(2)] + [("many-0", ce([]))]
            results = workers.forward_backward_many(calls)
            assert isinstance(results[2], UserError)
            for i in range(2):
                want = backend.forward_backward(f"one-{i}", ce(data))
                got = results[i]
                assert not isinstance(got, Exception), got
                assert got.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-5)
                for g, w in zip(got.loss_fn_outputs, want.loss_fn_outputs, strict=True):
                    np.testing.assert_allclose(g["logprobs"], w["logprobs"], atol=1e-5)
        for i in range(2):
            got = workers.optim_step(f"many-{i}", STEPS[0]).metrics["grad_norm"]
            assert got == pytest.approx(backend.optim_step(f"one-{i}", STEPS[0]).metrics["grad_norm"], rel=1e-5)
            assert_same_weights(snapshot(backend, f"one-{i}"), dict(workers.iter_trainable_weights(f"many-{i}")))
    finally:
        for i in range(2):
            workers.delete_model(f"many-{i}")


def test_the_engines_self_check_gets_the_workers_base_forward(backend, workers, tiny_model_dir):
    """`base_logprobs` over the workers (held whole: rank 0's base, under the adapters of this module's runs;
    sharded: a copy sharded for the call) is the in-process trainer's, and the core hands it to the engines'
    self-check (before: None, and the engine was left unchecked)."""
    workers.create_model("adapted", TINY_NAME, LORA)
    workers.forward_backward("adapted", ce(DATA))
    workers.optim_step("adapted", STEPS[0])  # an adapter off the identity on the base held whole
    sequences = check_prompts(tiny_model_dir) + [[3, 9, 27, 81, 12]]
    want = backend.base_logprobs(TINY_NAME, sequences)
    got = core_reference(workers, TINY_NAME, sequences)
    assert got is not None and got.tolerance == FLOAT32_TOLERANCE
    assert [len(row) for row in got.logprobs] == [len(row) for row in want.logprobs]
    np.testing.assert_allclose(np.concatenate(got.logprobs), np.concatenate(want.logprobs), atol=1e-5)
    assert workers.forward_backward("adapted", ce(DATA[:1])).metrics["loss:sum"] > 0  # the group carries on
    workers.delete_model("adapted")
    with pytest.raises(NotFoundError):
        workers.base_logprobs("nope", sequences)


def test_auto_holds_a_base_that_fits_whole(tiny_model_dir):
    size = base_bytes(tiny_model_dir, torch.float32)
    assert size == 4 * sum(p.numel() for p in load_causal_lm(tiny_model_dir, torch.device("cpu")).parameters())
    cpu, ram = torch.device("cpu"), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert not too_big(size, cpu, world_size=2)
    assert too_big(ram // 4, cpu, world_size=3)


def test_bad_input_is_a_user_error_and_the_group_carries_on(workers):
    workers.create_model("bad", TINY_NAME, LORA)
    bad = sft_data(seed=0, count=3, length=9)
    bad[2].loss_fn_inputs["target_tokens"][0] = 10**6
    with pytest.raises(UserError, match="datum 2"):
        workers.forward_backward("bad", ce(bad))
    assert (
        workers.forward_backward("bad", ce(DATA[:1])).metrics["loss:sum"] > 0
    )  # one datum: one worker idles


def test_local_workers_split_the_trainers_threads(tiny_model_dir):
    """The trainer's share of the CPU threads (tx/cpu.py) reaches every local worker, divided among them."""
    backend = create_workers_backend({TINY_NAME: tiny_model_dir}, 2, device="cpu", threads=1)
    try:
        backend.create_model("t", TINY_NAME, LORA)
        for share, each in ((4, 2), (1, 1)):
            backend.use_threads(share)
            replies = backend._call({rank: (Request(op="threads"), b"") for rank in (0, 1)})  # only asks
            assert [reply.metrics["threads"] for reply, _ in replies.values()] == [each, each]
            assert backend.forward_backward("t", ce(DATA)).metrics["loss:sum"] > 0
    finally:
        backend.close()


def test_split_by_tokens_keeps_order_and_balances():
    data = sft_data(seed=0, count=4, length=9) + sft_data(seed=0, count=1, length=33)
    shares = split_by_tokens(data, 2)
    assert [d for share in shares for d in share] == data
    assert [len(s) for s in shares] == [4, 1]
    assert sum(len(s) for s in split_by_tokens(data[:1], 3)) == 1


def test_datums_cross_the_control_channel_unchanged():
    datum = Datum(
        ModelInput(
            (TextChunk((1, 2)), ImageChunk(b"\x89PNG", "png", 4), ImageAssetPointer("file:///a.png", "png"))
        ),
        {"target_tokens": np.arange(6, dtype=np.int64).reshape(3, 2), "weights": np.ones(3, np.float32)},
        (ProvenanceSpan("s", 0, 3, True),),
    )
    back = WireDatum.model_validate_json(WireDatum.of(datum).model_dump_json()).datum()
    assert back.model_input == datum.model_input and back.loss_fn_input_spans == datum.loss_fn_input_spans
    for key, value in datum.loss_fn_inputs.items():
        assert back.loss_fn_inputs[key].dtype == value.dtype
        np.testing.assert_array_equal(back.loss_fn_inputs[key], value)
