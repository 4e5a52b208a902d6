"""Several runs in one training pass (tx/backends/torch/fused.py) equal each run alone, within 1e-5 in float32:
logprobs, losses, metrics, gradients and the optimizer step, for every loss, with packing, micro-batches that
mix runs and runs that span micro-batches, different ranks and LoRA targets per run, and forward-only passes.

Every run here has a twin with the same weights that trains alone (`forward_backward`), on the same backend.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from backend_helpers import TINY_NAME, TINY_VOCAB, datum, randomize, sequences, snapshot
from test_custom_loss_graph import uploaded

from tx.backends.torch import logprobs
from tx.backends.torch.backend import TorchBackend
from tx.backends.torch.lora import AdapterHost
from tx.config.sections import TrainerSection
from tx.optimizers import AdamParams
from tx.types import Datum, ForwardBackwardInput, LoraConfig, UserError

LOSSES = ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"]
LORAS = [  # runs differ in rank and targets: a LoRA layer some runs have and others do not
    LoraConfig(rank=4, seed=0),
    LoraConfig(rank=2, seed=1, train_unembed=False),
    LoraConfig(rank=8, seed=2, train_mlp=False),
]
LENGTHS = [(7, 9, 5), (12, 3, 6, 4), (15,)]  # per run: packed rows (3 + 4 share one), unequal widths
BUDGET = 40  # tokens per micro-batch: runs 0 and 1 share the first, 1 spans two, 2 shares the second


@pytest.fixture(scope="module")
def fused_backend(tiny_model_dir):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logprobs, "CHUNK_LOGITS", 5 * TINY_VOCAB)  # the head in chunks of 5 positions
        yield TorchBackend({TINY_NAME: tiny_model_dir}, device="cpu",
                           settings=TrainerSection(micro_batch_tokens=BUDGET))


def make_data(loss_name: str, lengths: tuple[int, ...], seed: int, width: int = 1) -> list[Datum]:
    rng = np.random.default_rng(seed)
    data = []
    for i, length in enumerate(lengths):
        seq = sequences(seed * 10 + i, 1, length + 1)[0]
        targets = seq[1:] if width == 1 else rng.integers(0, TINY_VOCAB, size=(length, width))
        shape = targets.shape
        if loss_name in ("cross_entropy", "custom"):
            inputs = {"weights": rng.normal(size=shape)}
        else:  # sampler logprobs near the model's (~ -6.2 for 512 tokens), so ratios stay near 1
            inputs = {"logprobs": -6.2 + 0.3 * rng.normal(size=shape), "advantages": rng.normal(size=shape)}
        if loss_name == "gspo":
            inputs["sequence_ratio_mask"] = rng.integers(0, 2, size=shape)
        data.append(datum(seq[:-1], target_tokens=targets, **inputs))
    return data


class Twins:
    """Runs `f0..` (trained together) and `a0..` (each alone), pairwise with the same weights."""

    def __init__(self, backend: TorchBackend, tag: str, loras=LORAS) -> None:
        self.backend, self.count = backend, len(loras)
        self.fused = [f"{tag}-f{i}" for i in range(self.count)]
        self.alone = [f"{tag}-a{i}" for i in range(self.count)]
        for i, lora in enumerate(loras):
            for model_id in (self.fused[i], self.alone[i]):
                backend.create_model(model_id, TINY_NAME, lora)
                randomize(backend, model_id, seed=10 + i)

    def close(self) -> None:
        for model_id in self.fused + self.alone:
            self.backend.delete_model(model_id)

    def step(self, batches: list[ForwardBackwardInput]) -> None:
        together = self.backend.forward_backward_many(list(zip(self.fused, batches, strict=True)))
        for i, batch in enumerate(batches):
            got = together[i]
            assert not isinstance(got, Exception), got
            want = self.backend.forward_backward(self.alone[i], batch)
            for g, w in zip(got.loss_fn_outputs, want.loss_fn_outputs, strict=True):
                assert g["logprobs"].shape == w["logprobs"].shape
                np.testing.assert_allclose(g["logprobs"], w["logprobs"], rtol=1e-5, atol=1e-5)
            assert got.metrics.keys() == want.metrics.keys()
            for name, value in want.metrics.items():
                assert got.metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-5), name
            self.same_grads(i)

    def same_grads(self, i: int) -> None:
        got, want = self.backend.gradients(self.fused[i]), self.backend.gradients(self.alone[i])
        for name, w in want.items():
            g = got[name]
            assert (g is None) == (w is None), name
            if w is not None:
                assert g is not None
                error, scale = float((g - w).abs().max()), max(1.0, float(w.abs().max()))
                assert error <= 1e-5 * scale, f"run {i} {name}: {error:.3g} at scale {scale:.3g}"

    def optim_step(self) -> None:
        for i in range(self.count):
            adam = AdamParams(learning_rate=1e-2 * (i + 1), grad_clip_norm=0.5 if i else 0.0)
            got = self.backend.optim_step(self.fused[i], adam).metrics
            assert got["grad_norm"] == pytest.approx(self.backend.optim_step(self.alone[i], adam).metrics["grad_norm"],
                                                     rel=1e-5)
            a, b = snapshot(self.backend, self.fused[i]), snapshot(self.backend, self.alone[i])
            for name in a:
                torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-5, msg=name)


def count_passes(patch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every body pass from now on."""
    rows: list[int] = []
    original = AdapterHost.hidden_states

    def counted(self, input_ids, **kwargs):
        rows.append(int(input_ids.shape[0]))
        return original(self, input_ids, **kwargs)

    patch.setattr(AdapterHost, "hidden_states", counted)
    return rows


@pytest.mark.parametrize("loss_name", LOSSES)
def test_runs_in_one_pass_equal_each_alone(fused_backend, loss_name):
    twins = Twins(fused_backend, loss_name)
    try:
        batches = [ForwardBackwardInput(make_data(loss_name, lengths, seed=i), loss_name)
                   for i, lengths in enumerate(LENGTHS)]
        assert fused_backend._fuses(TINY_NAME)  # the model's check, once, before the passes counted
        with pytest.MonkeyPatch.context() as patch:
            passes = count_passes(patch)
            fused_backend.forward_backward_many(list(zip(twins.fused, batches)))
        assert len(passes) == 2  # 3 runs, 66 tokens, micro-batches of 40: two passes, not three or more
        for i in range(len(LORAS)):  # that step's gradients, then a second one accumulating on them
            twins.backend.forward_backward(twins.alone[i], batches[i])
        twins.step(batches)
        twins.optim_step()
        twins.step(batches)  # after each run's own AdamW step
    finally:
        twins.close()


def test_different_losses_multi_target_datums_and_forward_only_in_one_pass(fused_backend):
    twins = Twins(fused_backend, "mixed")
    loss_names = ["cross_entropy", "ppo", "gspo"]
    try:
        for forward_only in (True, False):
            batches = [ForwardBackwardInput(make_data(name, lengths, seed=5 + i, width=1 + i), name,
                                            forward_only=forward_only)
                       for i, (name, lengths) in enumerate(zip(loss_names, LENGTHS))]
            twins.step(batches)
            if forward_only:
                assert all(g is None for i in range(3) for g in fused_backend.gradients(twins.fused[i]).values())
    finally:
        twins.close()


def test_custom_loss_in_one_pass(fused_backend):
    def weighted(logprobs, weights):
        return -(logprobs * weights).sum() + 0.1 * (logprobs ** 2).mean(), {"custom/sq:mean": (logprobs ** 2).mean()}

    loss = uploaded(weighted, {"logprobs": 1, "weights": 1})
    twins = Twins(fused_backend, "custom", LORAS[:2])
    try:
        batches = [ForwardBackwardInput(make_data("custom", lengths, seed=i), "custom", custom_loss=loss)
                   for i, lengths in enumerate(LENGTHS[:2])]
        twins.step(batches)
    finally:
        twins.close()


def test_a_bad_call_fails_alone(fused_backend):
    twins = Twins(fused_backend, "bad", LORAS[:2])
    try:
        good = ForwardBackwardInput(make_data("cross_entropy", LENGTHS[0], seed=1), "cross_entropy")
        bad = ForwardBackwardInput(make_data("cross_entropy", (4,), seed=2), "ppo")  # no ppo inputs
        results = fused_backend.forward_backward_many([(twins.fused[0], good), (twins.fused[1], bad),
                                                       ("no-such-run", good)])
        assert isinstance(results[1], UserError) and "ppo needs" in str(results[1])
        assert isinstance(results[2], Exception) and "no-such-run" in str(results[2])
        want = fused_backend.forward_backward(twins.alone[0], good)
        assert not isinstance(results[0], Exception)
        assert results[0].metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-5)
        assert all(g is None for g in fused_backend.gradients(twins.fused[1]).values())
    finally:
        twins.close()


def test_the_model_was_checked_once_and_fuses(fused_backend):
    assert fused_backend._fusion == {TINY_NAME: True}
