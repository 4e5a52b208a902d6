"""What cannot fit: running out of memory mid-request, refused sequences, the CUDA budget estimate; and
the settings that trade memory for time (gradient checkpointing, bf16) keep results."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from backend_helpers import TINY_NAME, ce, grads, randomize, sft_data, snapshot

from tx.backends.torch import fused as fused_module
from tx.backends.torch.memory import TrainerOutOfMemory, activation_bytes_per_token, cuda_micro_batch_tokens
from tx.config.sections import TrainerSection
from tx.optimizers import AdamParams
from tx.types import ForwardBackwardInput, LoraConfig, UserError

LORA = LoraConfig(rank=4, seed=0)


def _backend(model_dir, **settings):
    from tx.backends.torch.backend import TorchBackend

    return TorchBackend({TINY_NAME: model_dir}, device="cpu", settings=TrainerSection(**settings))


def test_out_of_memory_fails_the_request_and_the_server_goes_on(tiny_model_dir, monkeypatch):
    backend = _backend(tiny_model_dir, micro_batch_tokens=16)
    for model_id in ("a", "b"):
        backend.create_model(model_id, TINY_NAME, LORA)
        randomize(backend, model_id, seed=1)
    backend.forward_backward("a", ce(sft_data(seed=0, count=2, length=9)))
    before = grads(backend, "a")
    real, calls = fused_module.run_micro_batch, []

    def fake_out_of_memory(*args, **kwargs):  # a fake: the second micro-batch "runs out of memory"
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("fake allocation failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(fused_module, "run_micro_batch", fake_out_of_memory)
    with pytest.raises(TrainerOutOfMemory, match=r"micro-batches of up to 16 tokens.*fake allocation failure"):
        backend.forward_backward("a", ce(sft_data(seed=1, count=3, length=9)))  # 3 micro-batches
    assert calls == [1, 1]
    after = grads(backend, "a")  # the first micro-batch's gradients were taken back
    assert all(torch.equal(before[name], after[name]) for name in before)
    monkeypatch.setattr(fused_module, "run_micro_batch", real)
    assert np.isfinite(backend.forward_backward("a", ce(sft_data(seed=1, count=3, length=9))).metrics["loss:sum"])
    backend.optim_step("a", AdamParams(learning_rate=1e-3))
    assert np.isfinite(backend.forward_backward("b", ce(sft_data(seed=2, count=1, length=9))).metrics["loss:sum"])


def test_a_shared_pass_out_of_memory_runs_again_in_turns(tiny_model_dir, monkeypatch):
    """Runs sharing a pass (fused.py) that runs out of memory: every run's gradients as they were, then each
    run alone, with the results of each alone."""
    backend = _backend(tiny_model_dir, micro_batch_tokens=64)
    for model_id in ("a", "b", "a-twin"):
        backend.create_model(model_id, TINY_NAME, LORA)
        randomize(backend, model_id, seed=1)
    first = ce(sft_data(seed=0, count=2, length=9))
    backend.forward_backward("a", first)
    before = grads(backend, "a")
    real, shared = fused_module.run_parts, []

    def fake_out_of_memory(host, parts):  # a fake: any pass of several runs "runs out of memory"
        if len(parts) > 1:
            shared.append(len(parts))
            raise MemoryError("fake allocation failure")
        return real(host, parts)

    monkeypatch.setattr(fused_module, "run_parts", fake_out_of_memory)
    second = ce(sft_data(seed=1, count=2, length=9))
    results = backend.forward_backward_many([("a", second), ("b", ce(sft_data(seed=2, count=1, length=9)))])
    assert shared == [2] and not any(isinstance(r, Exception) for r in results)
    backend.forward_backward("a-twin", first)
    want = backend.forward_backward("a-twin", second)
    assert results[0].metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-6)
    twin = grads(backend, "a-twin")
    assert all(torch.allclose(grads(backend, "a")[n], twin[n], atol=1e-6) for n in before)


def test_sequences_over_the_cap_are_refused(tiny_model_dir):
    backend = _backend(tiny_model_dir, max_sequence_tokens=10)
    backend.create_model("m", TINY_NAME, LORA)
    batch = ce(sft_data(seed=0, count=1, length=9) + sft_data(seed=1, count=1, length=12))
    with pytest.raises(UserError, match=r"datum 1: 11 tokens exceed this server's limit of 10"):
        backend.check_batch(TINY_NAME, batch)  # at submission
    with pytest.raises(UserError, match=r"datum 1: 11 tokens exceed this server's limit of 10"):
        backend.forward_backward("m", batch)


def test_cuda_budget_follows_free_memory_and_checkpointing():
    full = activation_bytes_per_token(28, 1024, 3072, 2, checkpointing=False)
    saved = activation_bytes_per_token(28, 1024, 3072, 2, checkpointing=True)
    assert saved < full / 10
    assert cuda_micro_batch_tokens(80 << 30, saved) > cuda_micro_batch_tokens(80 << 30, full)
    assert cuda_micro_batch_tokens(20 << 30, saved) < cuda_micro_batch_tokens(80 << 30, saved)
    assert cuda_micro_batch_tokens(1 << 30, full) == 1024  # the floor
    assert cuda_micro_batch_tokens(80 << 30, saved) % 1024 == 0


def _pass(backend, model_id, data, loss="cross_entropy"):
    result = backend.forward_backward(model_id, ForwardBackwardInput(data, loss))
    return [o["logprobs"] for o in result.loss_fn_outputs], result.metrics["loss:sum"], grads(backend, model_id)


def test_gradient_checkpointing_gives_the_same_results(tiny_model_dir):
    data = sft_data(seed=3, count=3, length=14)
    results = []
    for checkpointing in (False, True):
        backend = _backend(tiny_model_dir, gradient_checkpointing=checkpointing, micro_batch_tokens=30)
        backend.create_model("m", TINY_NAME, LORA)
        randomize(backend, "m", seed=4)
        results.append(_pass(backend, "m", data))
    (lp0, loss0, g0), (lp1, loss1, g1) = results
    for a, b in zip(lp0, lp1):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert loss1 == pytest.approx(loss0, rel=1e-5)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-5, atol=1e-5)


def test_checkpointing_by_size_recomputes_only_the_passes_above_the_bound(tiny_model_dir):
    """The cuda default (`checkpoint_above`, set from free memory there): a pass of at most that many tokens
    keeps every layer's activations, a larger one recomputes them in backward; the results are the same."""
    backend = _backend(tiny_model_dir, gradient_checkpointing=True, micro_batch_tokens=64)
    data = sft_data(seed=3, count=2, length=14)  # one pass: 2 x 13 tokens packed in one row
    calls, results = [], {}
    for bound in (None, 26, 25):
        backend.create_model(f"m{bound}", TINY_NAME, LORA)
        randomize(backend, f"m{bound}", seed=4)
        host = backend._hosts[TINY_NAME]
        if not calls:
            # a module inside the layer: transformers 5.23 checkpoints the layer's forward, not its call (its
            # own hooks run once)
            attention = host.model.get_decoder().layers[0].self_attn
            attention.register_forward_pre_hook(lambda *_: calls.append(bound))
        host.checkpoint_above = bound
        calls.clear()
        results[bound] = (*_pass(backend, f"m{bound}", data), len(calls))
    assert [results[b][3] for b in (None, 26, 25)] == [2, 1, 2]  # the forward, and the recompute if checkpointing
    for bound in (26, 25):
        for a, b in zip(results[bound][0], results[None][0], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        for name, grad in results[None][2].items():
            torch.testing.assert_close(results[bound][2][name], grad, rtol=1e-5, atol=1e-5)


def test_bfloat16_base_keeps_lora_adam_and_logprobs_in_float32(tiny_model_dir):
    """bf16 base weights against float32: logprobs within 0.05 nats (the bound: bf16 keeps 8 bits of mantissa,
    ~4e-3 relative per weight, and logprobs here are ~6 nats; measured 0.017 on this model), LoRA weights,
    gradients and AdamW state in float32."""
    data = sft_data(seed=5, count=2, length=12)
    full, half = _backend(tiny_model_dir), _backend(tiny_model_dir, dtype="bfloat16")
    for backend in (full, half):
        backend.create_model("m", TINY_NAME, LORA)
        randomize(backend, "m", seed=6)
    assert half._hosts[TINY_NAME].model.get_input_embeddings().weight.dtype == torch.bfloat16
    lp_full, loss_full, _ = _pass(full, "m", data)
    lp_half, loss_half, g_half = _pass(half, "m", data)
    for a, b in zip(lp_full, lp_half):
        assert b.dtype == np.float32
        np.testing.assert_allclose(b, a, atol=0.05)
    assert loss_half == pytest.approx(loss_full, rel=1e-2)
    assert all(t.dtype == torch.float32 for t in snapshot(half, "m").values())
    assert all(g.dtype == torch.float32 for g in g_half.values())
    half.optim_step("m", AdamParams(learning_rate=1e-3))
    state = half._run("m").optimizer.state_dict()["state"]
    assert state and all(v.dtype == torch.float32 for entry in state.values() for k, v in entry.items() if k != "step")


_HEAP_PROBE = """
import sys
from pathlib import Path

import torch

from tx.backends.torch.backend import TorchBackend

def rss_mib():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS:"))
    return int(line.split()[1]) // 1024

if sys.argv[1] == "trainer":
    TorchBackend({}, device="cpu")
big = torch.ones(30 << 18)  # 30 MiB, then freed: glibc's dynamic threshold rises to it
del big
before = rss_mib()
held = [torch.ones(12 << 18) for _ in range(8)]  # 8 activations of 12 MiB
last = held.pop()  # one still alive above the others, so the heap's top cannot shrink
del held
print(rss_mib() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc heap behaviour")
def test_cpu_trainer_gives_freed_activations_back(tmp_path):
    """Regression: freed activations stayed in glibc's heap, so a request's peak RSS grew with the number
    of micro-batches it took (h256 at Qwen3's vocabulary, 32 x 2,048 tokens: 1,324 MiB above model + optimizer, 870 MiB with the fix)."""
    probe = tmp_path / "probe.py"
    probe.write_text(_HEAP_PROBE)
    kept = {}
    for mode in ("plain", "trainer"):
        done = subprocess.run([sys.executable, str(probe), mode], capture_output=True, text=True, check=True)
        kept[mode] = int(done.stdout.strip().splitlines()[-1])
    assert kept["plain"] >= 48, kept  # the behaviour this guards against, still there without the trainer
    assert kept["trainer"] <= 16, kept  # the one block still alive
