"""Every family on a GPU, against the same family on the CPU:

- the trainer on cuda (float32, micro-batches of 24 tokens laid out as the family's packing self-check chose on
  cuda) gives the CPU trainer's logprobs, loss and LoRA gradients;
- in bfloat16 (cuda's default dtype) a repeated batch's loss falls;
- the embedded engine's scheduler on cuda samples rows of unequal length whose logprobs are the model's own;
- two runs in one training pass (float32) equal each run alone, as the family's self-check allowed on cuda.

Everything GPU-only happens inside the tests, so collecting this module without a GPU only skips it.
Run with `pytest tests/gpu -m gpu -s` (prints each family's packing choice on cuda).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from families import FAMILIES
from reference_logprobs import token_logprobs

from tx.optimizers import AdamParams
from tx.types import Datum, ForwardBackwardInput, LoraConfig, ModelInput

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

LENGTHS = (7, 9, 30, 5, 12, 6)
VOCAB = 512  # below every tiny family's special and image tokens


def _data(seed: int = 0) -> list[Datum]:
    rng = np.random.default_rng(seed)
    data = []
    for length in LENGTHS:
        seq = rng.integers(0, VOCAB, size=length + 1)
        inputs = {"target_tokens": seq[1:].astype(np.int64),
                  "weights": rng.uniform(0.5, 1.5, length).astype(np.float32)}
        data.append(Datum(ModelInput.from_tokens(seq[:-1].tolist()), inputs))
    return data


def _set_lora(backend, model_id: str, seed: int) -> None:
    """Random LoRA values (a fresh adapter's B is zero, hiding A's gradients), the same on any device."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, tensor in backend.iter_trainable_weights(model_id):
            tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.05)


@pytest.fixture(scope="module")
def backends(family_model_dirs) -> Iterator[dict[str, object]]:
    from tx.backends.torch.backend import TorchBackend
    from tx.config.sections import TrainerSection

    fp32 = TrainerSection(micro_batch_tokens=24, dtype="float32", gradient_checkpointing=False)
    allow_tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # Qwen3.5's causal conv in true float32, as on the CPU
    yield {"cpu": TorchBackend(family_model_dirs, device="cpu", settings=fp32),
           "cuda": TorchBackend(family_model_dirs, device="cuda", settings=fp32)}
    torch.backends.cudnn.allow_tf32 = allow_tf32


@pytest.mark.parametrize("family", FAMILIES)
def test_the_trainer_on_cuda_gives_the_cpu_trainer_s_results(backends, family: str) -> None:
    results = {}
    for device, backend in backends.items():
        backend.create_model(f"{family}-{device}", family, LoraConfig(rank=4, seed=0))
        _set_lora(backend, f"{family}-{device}", seed=1)
        try:
            result = backend.forward_backward(f"{family}-{device}", ForwardBackwardInput(_data(), "cross_entropy"))
            grads = {n: g.detach().float().cpu() for n, g in backend.gradients(f"{family}-{device}").items()}
            results[device] = (result, grads, backend._hosts[family].packing)
        finally:
            backend.delete_model(f"{family}-{device}")
    (cpu, cpu_grads, cpu_packing), (cuda, cuda_grads, cuda_packing) = results["cpu"], results["cuda"]
    print(f"\n{family}: packing {cuda_packing} on cuda, {cpu_packing} on cpu")
    for got, want in zip(cuda.loss_fn_outputs, cpu.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(got["logprobs"], want["logprobs"], rtol=1e-4, atol=1e-4)
    assert cuda.metrics["loss:sum"] == pytest.approx(cpu.metrics["loss:sum"], rel=1e-4)
    assert set(cuda_grads) == set(cpu_grads)
    for name, want in cpu_grads.items():
        error, scale = float((cuda_grads[name] - want).abs().max()), max(1.0, float(want.abs().max()))
        assert error <= 1e-4 * scale, f"{name}: max error {error:.3g} at scale {scale:.3g}"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_repeated_batch_s_loss_falls_in_bfloat16_on_cuda(family_model_dirs, family: str) -> None:
    from tx.backends.torch.backend import TorchBackend

    backend = TorchBackend({family: family_model_dirs[family]}, device="cuda")
    assert backend.settings.dtype == "bfloat16"
    backend.create_model("run", family, LoraConfig(rank=8, seed=0))
    batch = ForwardBackwardInput(_data(seed=3), "cross_entropy")
    losses = []
    for _ in range(8):
        losses.append(backend.forward_backward("run", batch).metrics["loss:sum"])
        backend.optim_step("run", AdamParams(learning_rate=1e-2))
    print(f"\n{family} bf16 losses: {[round(x, 2) for x in losses]}")
    assert all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0], losses


PROMPTS = ([5, 17, 230, 1000, 44], [100, 200, 300, 7, 7, 9, 1500, 3, 900, 12, 8], [64, 2000])
STOPS = list(range(0, 2048, 7))  # ~1 token in 7 stops a row: rows end at different steps


@pytest.mark.parametrize("family", FAMILIES)
def test_the_embedded_engine_samples_every_family_on_cuda(family_model_dirs, family: str) -> None:
    from tx.inference.engines.embedded.scheduler import Scheduler
    from tx.inference.engines.embedded.weights import Weights
    from tx.inference.protocol import GenerateRequest
    from tx.models.auto import load_pretrained

    weights = Weights(family_model_dirs[family], max_adapters=1, device="cuda")
    scheduler = Scheduler(weights, max_batch_size=32, batch_wait_s=0.05)
    scheduler.start()
    try:
        requests = [GenerateRequest(prompt_token_ids=list(prompt), n=4, max_tokens=10, seed=i, stop_at_eos=False,
                                    stop_token_ids=STOPS) for i, prompt in enumerate(PROMPTS)]
        responses = [future.result(timeout=300) for future in [scheduler.submit(r) for r in requests]]
    finally:
        scheduler.close()
        weights.close()
    reference = load_pretrained(family_model_dirs[family], dtype=torch.float32).eval()
    lengths = set()
    for prompt, response in zip(PROMPTS, responses, strict=True):
        for sequence in response.sequences:
            lengths.add(len(sequence.token_ids))
            expected = token_logprobs(reference, list(prompt), sequence.token_ids)
            assert sequence.logprobs == pytest.approx(expected, abs=2e-4)
    assert len(lengths) > 2, f"rows should stop at different steps, got lengths {sorted(lengths)}"


@pytest.mark.parametrize("family", FAMILIES)
def test_two_runs_in_one_pass_on_cuda_equal_each_alone(backends, family: str) -> None:
    backend = backends["cuda"]
    fused, alone = [f"{family}-f{i}" for i in range(2)], [f"{family}-a{i}" for i in range(2)]
    for i, model_id in [(0, fused[0]), (1, fused[1]), (0, alone[0]), (1, alone[1])]:
        backend.create_model(model_id, family, LoraConfig(rank=4 - 2 * i, seed=i))
        _set_lora(backend, model_id, seed=10 + i)
    try:
        batches = [ForwardBackwardInput(_data(seed), "cross_entropy") for seed in (0, 7)]
        together = backend.forward_backward_many(list(zip(fused, batches, strict=True)))
        assert backend._fusion[family], f"{family}: the self-check sent the runs in turns on cuda"
        for i, batch in enumerate(batches):
            got, want = together[i], backend.forward_backward(alone[i], batch)
            assert not isinstance(got, Exception), got
            for g, w in zip(got.loss_fn_outputs, want.loss_fn_outputs, strict=True):
                np.testing.assert_allclose(g["logprobs"], w["logprobs"], rtol=1e-5, atol=1e-5)
            got_grads, want_grads = backend.gradients(fused[i]), backend.gradients(alone[i])
            for name, w in want_grads.items():
                error = float((got_grads[name] - w).abs().max())
                assert error <= 1e-5 * max(1.0, float(w.abs().max())), f"{name}: max error {error:.3g}"
    finally:
        for model_id in fused + alone:
            backend.delete_model(model_id)
