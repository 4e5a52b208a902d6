"""Micro-batched + chunked + packed training equals the naive one-pass computation (float32, 1e-5).

The backend under test cuts requests into micro-batches of 24 tokens, packs them into rows and computes
logprobs 5 positions at a time. The reference is plain PEFT on the same weights: one padded forward pass,
the full (B, T, V) logits, log_softmax, gather, the same loss formula, one backward.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from backend_helpers import TINY_NAME, TINY_VOCAB, datum, randomize, sequences, snapshot
from peft import get_peft_model, set_peft_model_state_dict
from transformers import AutoModelForCausalLM

from tx.backends.losses import get_loss
from tx.backends.torch.lora import peft_config_for
from tx.models.lora_targets import read_structure
from tx.backends.torch.ops import TORCH_OPS
from tx.types import Datum, ForwardBackwardInput, LoraConfig

LENGTHS = (7, 9, 30, 5, 12, 6)  # [7, 9], [30] alone (> the budget), [5, 12, 6]: 5 and 6 share a row
BUDGET = 24


@pytest.fixture(scope="module")
def micro_backend(tiny_model_dir):
    from tx.backends.torch import logprobs
    from tx.backends.torch.backend import TorchBackend
    from tx.config.sections import TrainerSection

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logprobs, "CHUNK_LOGITS", 5 * TINY_VOCAB)
        yield TorchBackend(
            {TINY_NAME: tiny_model_dir}, device="cpu", settings=TrainerSection(micro_batch_tokens=BUDGET)
        )


def _data(loss_name: str, widths=(1,) * len(LENGTHS), seed: int = 0) -> list[Datum]:
    rng = np.random.default_rng(seed)
    data = []
    for i, (length, width) in enumerate(zip(LENGTHS, widths)):
        seq = sequences(seed + i, 1, length + 1)[0]
        targets = seq[1:] if width == 1 else rng.integers(0, TINY_VOCAB, size=(length, width))
        shape = targets.shape
        if loss_name == "cross_entropy":
            inputs = {"weights": rng.normal(size=shape)}
        else:  # sampler logprobs near the model's (~ -6.2 for 512 tokens), so ratios stay near 1
            inputs = {"logprobs": -6.2 + 0.3 * rng.normal(size=shape), "advantages": rng.normal(size=shape)}
        if loss_name == "gspo":  # sequence-level: the ratio averages over the datum's masked tokens
            inputs["sequence_ratio_mask"] = rng.integers(0, 2, size=shape)
        data.append(datum(seq[:-1], target_tokens=targets, **inputs))
    return data


def _naive(model_dir, lora: LoraConfig, weights, data: list[Datum], loss_name: str, forward_only: bool):
    """(per-datum logprobs, loss, grads by PEFT file name) from one padded pass with full logits."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model = get_peft_model(base.eval(), peft_config_for(lora, read_structure(base)))
    set_peft_model_state_dict(model, weights)
    lengths = [len(d.model_input.text_tokens()) for d in data]
    width = max(d.loss_fn_inputs["target_tokens"].reshape(n, -1).shape[1] for d, n in zip(data, lengths))
    num, longest = len(data), max(lengths)
    ids, attention = torch.zeros(num, longest, dtype=torch.long), torch.zeros(num, longest, dtype=torch.long)
    targets = torch.zeros(num, longest, width, dtype=torch.long)
    mask = torch.zeros(num, longest, width, dtype=torch.bool)
    inputs = {k: torch.zeros(num, longest, width) for k in data[0].loss_fn_inputs if k != "target_tokens"}
    for row, (d, n) in enumerate(zip(data, lengths)):
        ids[row, :n], attention[row, :n] = torch.tensor(d.model_input.text_tokens()), 1
        k = d.loss_fn_inputs["target_tokens"].reshape(n, -1).shape[1]
        targets[row, :n, :k] = torch.from_numpy(d.loss_fn_inputs["target_tokens"].reshape(n, k))
        mask[row, :n, :k] = True
        for key in inputs:
            inputs[key][row, :n, :k] = torch.from_numpy(d.loss_fn_inputs[key].reshape(n, k))
    logits = model(input_ids=ids, attention_mask=attention).logits.float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets)
    loss_fn = get_loss(loss_name)
    loss = torch.where(mask, loss_fn.compute(TORCH_OPS, logp, inputs, loss_fn.resolve_config({})), 0.0).sum()
    if not forward_only:
        loss.backward()
    outputs = []
    for row, d in enumerate(data):
        shape = d.loss_fn_inputs["target_tokens"].shape
        piece = logp[row, : shape[0], : (shape[1] if len(shape) == 2 else 1)].detach().numpy()
        outputs.append(piece if len(shape) == 2 else piece[:, 0])
    grads = {n.replace(".default.", "."): p.grad for n, p in model.named_parameters() if p.requires_grad}
    return outputs, float(loss.detach()), grads


def _compare(backend, model_dir, model_id, lora, data, loss_name, forward_only=False):
    weights = snapshot(backend, model_id)
    batch = ForwardBackwardInput(data=data, loss_fn=loss_name, forward_only=forward_only)
    result = backend.forward_backward(model_id, batch)
    want_logprobs, want_loss, want_grads = _naive(model_dir, lora, weights, data, loss_name, forward_only)
    for got, want in zip(result.loss_fn_outputs, want_logprobs, strict=True):
        assert got["logprobs"].shape == want.shape
        np.testing.assert_allclose(got["logprobs"], want, rtol=1e-5, atol=1e-5)
    assert result.metrics["loss:sum"] == pytest.approx(want_loss, rel=1e-5, abs=1e-5)
    if forward_only:
        assert all(g is None for g in backend.gradients(model_id).values())
        return
    got_grads = backend.gradients(model_id)
    assert set(got_grads) == set(want_grads)
    for name, want in want_grads.items():
        assert_within(got_grads[name], want, name)


def assert_within(got: torch.Tensor, want: torch.Tensor, name: str, bound: float = 1e-5) -> None:
    """max |got - want| <= bound x max(1, max |want|): 1e-5 of the tensor's scale. (Gradients are sums over
    every token, so float32 rounding in a different summation order reaches ~2e-6 of the largest entry.)"""
    error, scale = float((got - want).abs().max()), max(1.0, float(want.abs().max()))
    assert error <= bound * scale, f"{name}: max error {error:.3g} at scale {scale:.3g}"


@pytest.mark.parametrize("train_unembed", [False, True])
@pytest.mark.parametrize("loss_name", ["cross_entropy", "importance_sampling", "ppo", "gspo"])
def test_micro_batched_equals_one_pass(micro_backend, tiny_model_dir, loss_name, train_unembed):
    lora = LoraConfig(rank=4, seed=0, train_unembed=train_unembed)
    model_id = f"{loss_name}-{train_unembed}"
    micro_backend.create_model(model_id, TINY_NAME, lora)
    randomize(micro_backend, model_id, seed=1)
    try:
        _compare(micro_backend, tiny_model_dir, model_id, lora, _data(loss_name), loss_name)
    finally:
        micro_backend.delete_model(model_id)


def test_multi_target_datums_and_forward_only(micro_backend, tiny_model_dir):
    lora = LoraConfig(rank=4, seed=0)
    micro_backend.create_model("k", TINY_NAME, lora)
    randomize(micro_backend, "k", seed=2)
    data = _data("cross_entropy", widths=(1, 3, 2, 1, 3, 2), seed=5)
    try:
        _compare(micro_backend, tiny_model_dir, "k", lora, data, "cross_entropy", forward_only=True)
        _compare(micro_backend, tiny_model_dir, "k", lora, data, "cross_entropy")
    finally:
        micro_backend.delete_model("k")
