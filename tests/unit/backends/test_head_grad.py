"""The per-token head's gradient by hand (`tx/backends/torch/head_grad.py`) against autograd through PEFT's own
head: logprobs, loss and every LoRA gradient within 1e-5 in float32, for each per-token loss, one chunk or
several, K targets per position, a head with and without LoRA; and it is taken where it applies, not elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from backend_helpers import TINY_NAME, datum, grads, randomize, sequences

import tx.backends.torch.head_grad as head_grad
import tx.backends.torch.logprobs as logprobs
import tx.backends.torch.step as step
from tx.types import ForwardBackwardInput, LoraConfig

PER_TOKEN = ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]


def _batch(loss_fn: str, width: int = 1) -> ForwardBackwardInput:
    """Three datums of 20 positions; with `width` > 1, cross_entropy's targets are (20, width) for the second."""
    rng = np.random.default_rng(8)
    data = []
    for i, s in enumerate(sequences(seed=7, count=3, length=21)):
        if loss_fn == "cross_entropy":
            k = width if i == 1 else 1
            targets = s[1:] if k == 1 else rng.integers(0, 512, size=(20, k))
            weights = rng.uniform(0.0, 1.0, size=np.shape(targets))
            data.append(datum(s[:-1], target_tokens=targets, weights=weights))
        else:
            # sampled logprobs near the model's (~ -log 512): ratios near 1, as in RL (a ratio of e^6 makes the
            # gradients ~100 and 1e-5 a bound on float32's own rounding)
            data.append(datum(s[:-1], target_tokens=s[1:], logprobs=-rng.uniform(5.5, 7.0, size=20),
                              advantages=rng.normal(size=20), sequence_ratio_mask=np.ones(20)))
    return ForwardBackwardInput(data, loss_fn, {})


def _pass(backend, batch: ForwardBackwardInput, lora: LoraConfig, counter: list[int]):
    backend.create_model("m", TINY_NAME, lora)
    randomize(backend, "m", seed=3)
    before = counter[0]
    result = backend.forward_backward("m", batch)
    out = result, grads(backend, "m"), counter[0] - before
    backend.delete_model("m")
    return out


def _counting(monkeypatch) -> list[int]:
    """How many heads `per_token_by_hand` computed (not declined)."""
    counter = [0]
    original = head_grad.per_token_by_hand

    def counted(*args, **kwargs):
        result = original(*args, **kwargs)
        counter[0] += result is not None
        return result

    monkeypatch.setattr(logprobs, "per_token_by_hand", counted)
    return counter


def _assert_same(got, want) -> None:
    (result, result_grads), (reference, reference_grads) = got, want
    for got_out, want_out in zip(result.loss_fn_outputs, reference.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(got_out["logprobs"], want_out["logprobs"], rtol=1e-5, atol=1e-5)
    assert result.metrics["loss:sum"] == pytest.approx(reference.metrics["loss:sum"], rel=1e-5, abs=1e-5)
    assert result_grads.keys() == reference_grads.keys()
    for key, value in reference_grads.items():
        assert value is not None and result_grads[key] is not None, key
        torch.testing.assert_close(result_grads[key], value, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_logits", [None, 4096])  # one chunk; chunks of 8 positions (vocab 512)
@pytest.mark.parametrize("loss_fn", PER_TOKEN)
@pytest.mark.parametrize("lora", [LoraConfig(rank=8, seed=0),
                                  LoraConfig(rank=4, seed=1, train_attn=False, train_mlp=False),
                                  LoraConfig(rank=4, seed=2, train_unembed=False)],
                         ids=["all", "unembed only", "no unembed"])
def test_by_hand_equals_autograd_through_pefts_head(backend, monkeypatch, loss_fn, chunk_logits, lora):
    if chunk_logits is not None:
        monkeypatch.setattr(logprobs, "CHUNK_LOGITS", chunk_logits)
    counter = _counting(monkeypatch)
    batch = _batch(loss_fn)
    result, result_grads, taken = _pass(backend, batch, lora, counter)
    assert taken == 1, "the head's gradient was not computed by hand"
    monkeypatch.setattr(step, "lean_head", lambda module: module)  # PEFT's head (or the plain Linear) ...
    monkeypatch.setattr(logprobs, "per_token_by_hand", lambda *args: None)  # ... under autograd: the reference
    reference, reference_grads, _ = _pass(backend, batch, lora, counter)
    _assert_same((result, result_grads), (reference, reference_grads))
    if lora.train_unembed:
        assert any(".lm_head." in key and value is not None and value.any() for key, value in result_grads.items())


def test_by_hand_with_several_targets_per_position(backend, monkeypatch):
    counter = _counting(monkeypatch)
    batch = _batch("cross_entropy", width=3)
    lora = LoraConfig(rank=8, seed=0)
    got = _pass(backend, batch, lora, counter)
    assert got[2] == 1
    monkeypatch.setattr(logprobs, "per_token_by_hand", lambda *args: None)
    want = _pass(backend, batch, lora, counter)
    _assert_same(got[:2], want[:2])
    assert got[0].loss_fn_outputs[1]["logprobs"].shape == (20, 3)


def test_other_heads_and_losses_take_autograd(backend, monkeypatch):
    counter = _counting(monkeypatch)
    lora = LoraConfig(rank=8, seed=0)
    monkeypatch.setattr(step, "lean_head", lambda module: module)  # PEFT's LoRA module: not a plain head
    assert _pass(backend, _batch("cross_entropy"), lora, counter)[2] == 0
    monkeypatch.undo()
    counter = _counting(monkeypatch)
    gspo = ForwardBackwardInput(_batch("ppo").data, "gspo", {})  # not per-token: the checkpointed general path
    assert _pass(backend, gspo, lora, counter)[2] == 0


def test_declines_other_dtypes_and_trained_base_heads():
    head = torch.nn.Linear(8, 32, bias=False)
    hidden, targets = torch.randn(4, 8), torch.zeros(4, 1, dtype=torch.long)

    def loss(logp: torch.Tensor, rows: slice) -> torch.Tensor:
        return -logp.sum()

    assert head_grad.per_token_by_hand(hidden, head, targets, 4, loss) is None  # its weight is trained
    head.weight.requires_grad_(False)
    assert head_grad.per_token_by_hand(hidden, head, targets, 4, loss) is not None
    assert head_grad.per_token_by_hand(hidden.double(), head.double(), targets, 4, loss) is None
