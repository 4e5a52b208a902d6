"""The body's lean LoRA layers (`tx/backends/torch/lean_body.py`) against PEFT's own forward: a training pass's
logprobs, loss and gradients within 1e-5 in float32, the lean forward taken on every plain LoRA layer of the
body (alone and per block of a shared pass), and PEFT's forward kept for every other layer and call. Every
family's pass against PEFT: tests/unit/backends/test_family_packing.py."""

from __future__ import annotations

import contextlib

import numpy as np
import peft
import pytest
import torch
from backend_helpers import TINY_NAME, datum, make_unplain, peft_pass, randomize, sequences
from peft.tuners.lora.layer import Linear as LoraLinear

import tx.backends.torch.segments as segments
import tx.backends.torch.step as step
from tx.backends.torch.lean_body import lean_linears
from tx.types import ForwardBackwardInput, LoraConfig


def _batch(loss_fn: str, forward_only: bool = False) -> ForwardBackwardInput:
    rng = np.random.default_rng(5)
    data = [datum(s[:-1], target_tokens=s[1:], weights=rng.uniform(0.0, 1.0, size=20),
                  logprobs=-rng.uniform(5.5, 7.0, size=20), advantages=rng.normal(size=20),
                  sequence_ratio_mask=np.ones(20))
            for s in sequences(seed=4, count=3, length=21)]
    return ForwardBackwardInput(data, loss_fn, {}, forward_only=forward_only)


def _pass(backend, batch: ForwardBackwardInput, lora: LoraConfig):
    """One fresh run's result and gradients, and how many body LoRA layers ran PEFT's forward."""
    result, gradients, called = peft_pass(backend, batch, lora)
    return result, gradients, len(called - {id(backend._hosts[TINY_NAME].unembedding)})


@pytest.mark.parametrize(("loss_fn", "forward_only"), [("cross_entropy", False), ("ppo", False),
                                                       ("gspo", False), ("cross_entropy", True)])
@pytest.mark.parametrize("lora", [LoraConfig(rank=8, seed=0), LoraConfig(rank=4, seed=1, train_unembed=False)])
def test_lean_layers_equal_pefts(backend, monkeypatch, loss_fn, forward_only, lora):
    batch = _batch(loss_fn, forward_only)
    lean, lean_grads, peft_layers = _pass(backend, batch, lora)
    assert peft_layers == 0, "a body LoRA layer ran PEFT's forward"
    monkeypatch.setattr(step, "lean_linears", lambda *args: contextlib.nullcontext())
    want, want_grads, peft_layers = _pass(backend, batch, lora)
    assert peft_layers == 14  # 7 projections x 2 layers
    for got_out, want_out in zip(lean.loss_fn_outputs, want.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(got_out["logprobs"], want_out["logprobs"], rtol=1e-5, atol=1e-5)
    assert lean.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-5, abs=1e-5)
    assert lean_grads.keys() == want_grads.keys()
    for key, value in want_grads.items():
        if forward_only:
            assert value is None or not value.any()
        else:
            assert value is not None and lean_grads[key] is not None, key
            torch.testing.assert_close(lean_grads[key], value, rtol=1e-5, atol=1e-5)


def test_several_runs_in_one_pass_take_the_lean_layer_per_block(backend, monkeypatch):
    loras = [LoraConfig(rank=8, seed=0), LoraConfig(rank=4, seed=1, train_mlp=False)]
    for i, lora in enumerate(loras):
        backend.create_model(f"r{i}", TINY_NAME, lora)
        randomize(backend, f"r{i}", seed=3 + i)
    assert backend._fuses(TINY_NAME)  # the model's one-off check first
    lean, peft_calls = [], []
    original, original_output = LoraLinear.forward, segments.lean_output
    monkeypatch.setattr(segments, "lean_output", lambda *args: lean.append(1) or original_output(*args))
    monkeypatch.setattr(LoraLinear, "forward", lambda self, *a, **k: peft_calls.append(1) or original(self, *a, **k))
    results = backend.forward_backward_many([(f"r{i}", _batch("ppo")) for i in range(2)])
    assert not any(isinstance(result, Exception) for result in results)
    assert peft_calls == []  # the head too: the trainer's head computes it from its weights
    assert len(lean) == 14 + 8  # run 0 on 7 projections x 2 layers, run 1 on the attention's 4 x 2


def _model(**config) -> peft.PeftModel:
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("proj", torch.nn.Linear(16, 24, bias=True))
    model.add_module("lm_head", torch.nn.Linear(24, 32, bias=False))
    settings = {"r": 4, "lora_alpha": 8, "target_modules": ["proj", "lm_head"], **config}
    peft_model = peft.get_peft_model(model, peft.LoraConfig(**settings))
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param)
    return peft_model


def _layer(model: peft.PeftModel, name: str = "proj") -> LoraLinear:
    module = getattr(model.base_model.model, name)
    assert isinstance(module, LoraLinear)
    return module


def test_lean_layer_is_pefts_forward_and_backward():
    model = _model()
    layer, head = _layer(model), _layer(model, "lm_head")
    x = torch.randn(3, 5, 16)

    def run(lean: bool) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        inputs = x.clone().requires_grad_()
        with lean_linears(model, skip=head) if lean else contextlib.nullcontext() as count:
            out = layer(inputs)
            out.pow(2).sum().backward()
        if lean:
            assert count == 1  # the skipped head is not made lean
        weights = [layer.lora_A["default"].weight, layer.lora_B["default"].weight]
        return [out.detach(), inputs.grad, *(w.grad for w in weights)]

    for got, want in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "forward" not in vars(layer)  # removed when the pass ends


@pytest.mark.parametrize("case", ["dropout", "dora", "two adapters", "hooked", "merged", "disabled"])
def test_other_layers_keep_pefts_forward(case):
    model = _model(lora_dropout=0.1 if case == "dropout" else 0.0, use_dora=case == "dora")
    layer = _layer(model)
    make_unplain(model, layer, case, "proj")
    with lean_linears(model, skip=_layer(model, "lm_head")) as count:
        assert count == 0
        assert "forward" not in vars(layer)


def test_calls_it_cannot_take_run_pefts_forward(monkeypatch):
    model = _model()
    layer = _layer(model)
    calls = []
    original = LoraLinear.forward
    monkeypatch.setattr(LoraLinear, "forward", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    with lean_linears(model):
        layer(torch.randn(2, 16))
        assert calls == []
        layer.lora_A["default"].double()  # factors in another dtype than the input's: PEFT casts
        layer.lora_B["default"].double()
        layer(torch.randn(2, 16))
        assert calls == [1]
        layer.lora_A["default"].float()
        layer.lora_B["default"].float()
        layer.base_layer.weight.requires_grad_(True)  # a trained base
        layer(torch.randn(2, 16))
        assert calls == [1, 1]
        layer.base_layer.weight.requires_grad_(False)
        layer.base_layer.bfloat16()  # tx's GPU default: a bfloat16 base, float32 factors
        layer(torch.randn(2, 16, dtype=torch.bfloat16))
        assert calls == [1, 1, 1]
