"""The trainer's lean LoRA head (`tx/backends/torch/head.py`) against PEFT's own forward: logprobs, loss and
gradients within 1e-5 in float32, on both head paths (per-token chunks and the checkpointed general path),
and taken where it applies; every other LoRA head falls back to the module."""

from __future__ import annotations

import numpy as np
import peft
import pytest
import torch
from backend_helpers import TINY_NAME, datum, make_unplain, peft_pass, sequences
from peft.tuners.lora.layer import Linear as LoraLinear

import tx.backends.torch.step as step
from tx.backends.torch.head import LeanHead, lean_head
from tx.types import ForwardBackwardInput, LoraConfig


def _batch(loss_fn: str, forward_only: bool = False) -> ForwardBackwardInput:
    seqs = sequences(seed=7, count=3, length=21)
    rng = np.random.default_rng(8)
    data = [
        datum(s[:-1], target_tokens=s[1:], logprobs=-rng.uniform(0.5, 8.0, size=20),
              advantages=rng.normal(size=20), sequence_ratio_mask=np.ones(20))
        for s in seqs
    ]
    if loss_fn == "cross_entropy":
        data = [datum(s[:-1], target_tokens=s[1:], weights=rng.uniform(0.0, 1.0, size=20)) for s in seqs]
    return ForwardBackwardInput(data, loss_fn, {}, forward_only=forward_only)


def _pass(backend, batch: ForwardBackwardInput, lora: LoraConfig):
    """One fresh run's result and gradients, and whether PEFT's forward ran on the head."""
    result, gradients, called = peft_pass(backend, batch, lora)
    return result, gradients, id(backend._hosts[TINY_NAME].unembedding) in called


@pytest.mark.parametrize(
    ("loss_fn", "forward_only", "chunk_logits"),
    [("cross_entropy", False, None), ("cross_entropy", False, 4096), ("gspo", False, 4096),
     ("cross_entropy", True, None)],
)
@pytest.mark.parametrize("lora", [LoraConfig(rank=8, seed=0), LoraConfig(rank=4, seed=1, train_attn=False,
                                                                          train_mlp=False)])
def test_lean_head_equals_pefts(backend, monkeypatch, loss_fn, forward_only, chunk_logits, lora):
    if chunk_logits is not None:  # several chunks of 8 positions (vocab 512)
        monkeypatch.setattr("tx.backends.torch.logprobs.CHUNK_LOGITS", chunk_logits)
    batch = _batch(loss_fn, forward_only)
    lean, lean_grads, peft_ran = _pass(backend, batch, lora)
    assert not peft_ran, "the lean head was not taken"
    monkeypatch.setattr(step, "lean_head", lambda module: module)  # PEFT's forward: the reference
    want, want_grads, peft_ran = _pass(backend, batch, lora)
    assert peft_ran
    for got_out, want_out in zip(lean.loss_fn_outputs, want.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(got_out["logprobs"], want_out["logprobs"], rtol=1e-5, atol=1e-5)
    assert lean.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-5, abs=1e-5)
    assert lean_grads.keys() == want_grads.keys()
    for key, value in want_grads.items():
        if forward_only:
            assert value is None or not value.any()
            continue
        assert value is not None and lean_grads[key] is not None, key
        torch.testing.assert_close(lean_grads[key], value, rtol=1e-5, atol=1e-5)
    if not forward_only:
        assert any(".lm_head." in key and value is not None and value.any() for key, value in lean_grads.items())


def _lora_head(**config) -> peft.PeftModel:
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("lm_head", torch.nn.Linear(16, 32, bias=False))
    settings = {"r": 4, "lora_alpha": 8, "target_modules": ["lm_head"], **config}
    return peft.get_peft_model(model, peft.LoraConfig(**settings))


def _head(model: peft.PeftModel) -> LoraLinear:
    module = model.base_model.model.lm_head
    assert isinstance(module, LoraLinear)
    return module


def test_lean_head_is_pefts_forward_on_a_plain_lora():
    model = _lora_head()
    head = _head(model)
    torch.nn.init.normal_(head.lora_B["default"].weight)
    lean = lean_head(head)
    assert isinstance(lean, LeanHead)
    x = torch.randn(5, 16)
    torch.testing.assert_close(lean(x), head(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["dropout", "dora", "two adapters", "hooked", "merged", "disabled", "not lora"])
def test_other_heads_fall_back_to_the_module(case):
    model = _lora_head(lora_dropout=0.1 if case == "dropout" else 0.0, use_dora=case == "dora")
    head = _head(model)
    make_unplain(model, head, case, "lm_head")
    module = head.base_layer if case == "not lora" else head
    assert lean_head(module) is module
