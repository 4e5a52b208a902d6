"""forward_backward and optim_step of the torch backend on a tiny Qwen3."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from backend_helpers import TINY_NAME, ce, datum, grads, randomize, sft_data, snapshot, train
from peft import get_peft_model, set_peft_model_state_dict
from transformers import AutoModelForCausalLM

from tx.backends.torch.lora import peft_config_for
from tx.models.lora_targets import read_structure
from tx.optimizers import AdamParams
from tx.types import LoraConfig

LORA = LoraConfig(rank=8, seed=0)


def test_sft_memorisation_halves_the_nll(backend):
    backend.create_model("m", TINY_NAME, LORA)
    data = sft_data(seed=0, count=4, length=33)
    num_tokens = 4 * 32
    first = None
    for step in range(30):
        result = backend.forward_backward("m", ce(data))
        nll = result.metrics["loss:sum"] / num_tokens
        first = nll if first is None else first
        if nll <= 0.5 * first:
            break
        backend.optim_step("m", AdamParams(learning_rate=5e-3))
    assert nll <= 0.5 * first, f"mean NLL went from {first:.3f} to {nll:.3f} in {step} steps"


def test_outputs_are_per_datum_logprobs(backend):
    backend.create_model("m", TINY_NAME, LORA)
    data = [datum([1, 2, 3], target_tokens=[2, 3, 4]), datum([5] * 7, target_tokens=[[5, 6]] * 7)]
    result = backend.forward_backward("m", ce(data, forward_only=True))
    shapes = [out["logprobs"].shape for out in result.loss_fn_outputs]
    assert shapes == [(3,), (7, 2)]
    assert all(out["logprobs"].dtype == np.float32 for out in result.loss_fn_outputs)
    assert all(key.count(":") == 1 for key in result.metrics)
    expected = -sum(float(out["logprobs"].sum()) for out in result.loss_fn_outputs)
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)


def test_padding_does_not_change_a_datums_logprobs(backend):
    backend.create_model("m", TINY_NAME, LORA)
    short, long = sft_data(seed=1, count=1, length=9), sft_data(seed=2, count=1, length=40)
    alone = backend.forward_backward("m", ce(short, forward_only=True)).loss_fn_outputs[0]["logprobs"]
    padded = backend.forward_backward("m", ce(short + long, forward_only=True)).loss_fn_outputs[0]["logprobs"]
    np.testing.assert_allclose(padded, alone, rtol=1e-5, atol=1e-5)


def _reference_grads(model_dir, backend, model_id, data, weights, dtype=torch.float32):
    """-(d/dθ) Σ w·logp on a plain PEFT model holding the run's weights, by hand with autograd, in `dtype`."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = get_peft_model(base, peft_config_for(LORA, read_structure(base)))
    set_peft_model_state_dict(model, {name: t.to(dtype) for name, t in snapshot(backend, model_id).items()})
    total = 0.0
    for d, w in zip(data, weights):
        ids = torch.tensor([d.model_input.text_tokens()])
        logp = torch.log_softmax(model(input_ids=ids).logits[0], dim=-1)
        targets = torch.from_numpy(d.loss_fn_inputs["target_tokens"])
        total = total + (torch.from_numpy(w).to(dtype) * logp.gather(-1, targets[:, None])[:, 0]).sum()
    total.backward()
    named = {n.replace(".default.", "."): p.grad for n, p in model.named_parameters() if p.requires_grad}
    return {name: -g for name, g in named.items()}


def test_cross_entropy_grads_match_autograd_with_arbitrary_weights(backend, tiny_model_dir):
    """tx's gradients against float64 autograd through PEFT, within float32's own error there.

    The reference is float64: a float32 one carries float32's rounding too (~5e-6 on gradients of magnitude ~6
    here), and two float32 computations summing in different orders (tx's LoRA layers and head, `lean_body.py`,
    `head_grad.py`, against PEFT's autograd) differ by about that much. Float32's own error is what plain PEFT in
    float32 is off by from float64, relative to each tensor's scale, at most over the tensors (~1.2e-6 here);
    tx's, relative to each tensor's scale, must be within 3x of it (measured: 1.5x at most). A real slip is far
    above: a LoRA scaling off by 1e-4 in one layer kind, or A's gradient summed over one token too few."""
    backend.create_model("m", TINY_NAME, LORA)
    randomize(backend, "m", seed=3)
    rng = np.random.default_rng(4)
    weights = [rng.normal(size=15).astype(np.float32), rng.normal(size=10).astype(np.float32) * 0.3]
    weights[1][:4] = [-2.0, 0.0, 0.25, 1.5]
    data = [sft_data(seed=10 + i, count=1, length=n, weights=[weights[i]])[0] for i, n in enumerate((16, 11))]
    backend.forward_backward("m", ce(data))
    got = grads(backend, "m")
    exact = _reference_grads(tiny_model_dir, backend, "m", data, weights, dtype=torch.float64)
    float32 = _reference_grads(tiny_model_dir, backend, "m", data, weights)
    assert set(got) == set(exact)

    def relative_error(value: torch.Tensor | None, want: torch.Tensor) -> float:
        assert value is not None and value.dtype == torch.float32
        return float((value.double() - want).abs().max() / want.abs().max())

    own = max(relative_error(float32[name], want) for name, want in exact.items())
    assert own < 1e-5  # the float32 reference itself agrees with float64 (a broken reference is not a bound)
    for name, want in exact.items():
        error = relative_error(got[name], want)
        assert error <= 3 * own, f"{name}: {error:.3g} of its scale off float64 (float32 PEFT: {own:.3g})"


def test_zero_weights_give_zero_loss_and_zero_grads(backend):
    backend.create_model("m", TINY_NAME, LORA)
    randomize(backend, "m", seed=5)
    data = sft_data(seed=0, count=2, length=12, weights=np.zeros((2, 11)))
    result = backend.forward_backward("m", ce(data))
    assert result.metrics["loss:sum"] == 0.0
    assert all(g is not None and torch.count_nonzero(g) == 0 for g in grads(backend, "m").values())


def test_forward_only_leaves_grads_alone(backend):
    backend.create_model("m", TINY_NAME, LORA)
    randomize(backend, "m", seed=6)
    backend.forward_backward("m", ce(sft_data(seed=0, count=2, length=12)))
    before = grads(backend, "m")
    backend.forward_backward("m", ce(sft_data(seed=1, count=3, length=20), forward_only=True))
    after = grads(backend, "m")
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_forward_only_on_a_fresh_run_creates_no_grads(backend):
    backend.create_model("m", TINY_NAME, LORA)
    backend.forward_backward("m", ce(sft_data(seed=0, count=2, length=12), forward_only=True))
    assert all(g is None for g in grads(backend, "m").values())


def test_chunked_accumulation_equals_one_call(backend):
    data = sft_data(seed=7, count=4, length=17)
    for model_id in ("one", "chunked"):
        backend.create_model(model_id, TINY_NAME, LORA)
        randomize(backend, model_id, seed=8)
    whole = backend.forward_backward("one", ce(data)).metrics["loss:sum"]
    chunks = (data[:1], data[1:])
    parts = [backend.forward_backward("chunked", ce(chunk)).metrics["loss:sum"] for chunk in chunks]
    assert sum(parts) == pytest.approx(whole, rel=1e-5)
    g_one, g_chunked = grads(backend, "one"), grads(backend, "chunked")
    for name in g_one:
        torch.testing.assert_close(g_chunked[name], g_one[name], rtol=1e-4, atol=1e-6)
    for model_id in ("one", "chunked"):
        backend.optim_step(model_id, AdamParams(learning_rate=1e-2))
    w_one, w_chunked = snapshot(backend, "one"), snapshot(backend, "chunked")
    for name in w_one:
        torch.testing.assert_close(w_chunked[name], w_one[name], rtol=1e-4, atol=1e-6)


def test_optim_step_zeroes_grads_and_reports_metrics(backend):
    backend.create_model("m", TINY_NAME, LORA)
    backend.forward_backward("m", ce(sft_data(seed=0, count=2, length=12)))
    expected_norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g) for g in grads(backend, "m").values() if g is not None])
    )
    metrics = backend.optim_step("m", AdamParams(learning_rate=1e-3)).metrics
    assert metrics["grad_norm"] == pytest.approx(float(expected_norm), rel=1e-5)
    assert metrics["learning_rate"] == 1e-3
    assert all(g is None for g in grads(backend, "m").values())


def _step_from(backend, model_id: str, adam: AdamParams, steps: int = 1) -> dict[str, torch.Tensor]:
    """Fresh run (same seed, randomized weights), `steps` steps of `adam`; the resulting weights."""
    backend.create_model(model_id, TINY_NAME, LORA)
    randomize(backend, model_id, seed=9)
    for step in range(steps):
        backend.forward_backward(model_id, ce(sft_data(seed=step, count=2, length=12)))
        backend.optim_step(model_id, adam)
    return snapshot(backend, model_id)


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(((a[n] - b[n]) ** 2).sum() for n in a)))


def test_every_adam_param_has_an_effect(backend):
    start = _step_from(backend, "start", AdamParams(learning_rate=1e-2), steps=0)
    base = AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
    reference = _step_from(backend, "ref", base, steps=2)
    assert _distance(reference, start) > 0
    assert _distance(_step_from(backend, "lr0", AdamParams(learning_rate=0.0), steps=2), start) == 0.0
    for i, change in enumerate(({"beta1": 0.5}, {"beta2": 0.5}, {"eps": 1.0})):
        changed = _step_from(backend, f"c{i}", AdamParams(**{**base.__dict__, **change}), steps=2)
        assert _distance(changed, reference) > 1e-4, change


def test_weight_decay_shrinks_the_weights(backend):
    lr, wd = 1e-2, 0.5
    start = _step_from(backend, "start", AdamParams(learning_rate=lr), steps=0)
    plain = _step_from(backend, "plain", AdamParams(learning_rate=lr))
    decayed = _step_from(backend, "decayed", AdamParams(learning_rate=lr, weight_decay=wd))
    for name in start:  # AdamW: θ ← θ·(1 - lr·wd) - lr·adam_update
        torch.testing.assert_close(decayed[name], plain[name] - lr * wd * start[name], rtol=1e-5, atol=1e-7)


def test_grad_clip_norm_limits_the_update(backend):
    # with a large eps Adam's first update is ~ lr·g/eps, so it scales with the (clipped) gradient
    lr, eps, clip = 1.0, 1e3, 1e-2
    start = _step_from(backend, "start", AdamParams(learning_rate=lr, eps=eps), steps=0)
    free = _step_from(backend, "free", AdamParams(learning_rate=lr, eps=eps))
    clipped = _step_from(backend, "clipped", AdamParams(learning_rate=lr, eps=eps, grad_clip_norm=clip))
    assert _distance(clipped, start) <= lr * clip / eps * 1.01
    assert _distance(free, start) > 10 * _distance(clipped, start)


def test_two_runs_on_one_base_model_are_isolated(backend):
    backend.create_model("a", TINY_NAME, LORA)
    backend.create_model("b", TINY_NAME, LoraConfig(rank=4, seed=1, train_mlp=False))
    randomize(backend, "b", seed=10)
    probe = sft_data(seed=11, count=2, length=10)
    b_logprobs = backend.forward_backward("b", ce(probe, forward_only=True)).loss_fn_outputs
    backend.forward_backward("b", ce(sft_data(seed=12, count=1, length=10)))
    b_weights, b_grads = snapshot(backend, "b"), grads(backend, "b")

    train(backend, "a", sft_data(seed=0, count=2, length=12), steps=3, lr=1e-2)

    assert all(torch.equal(b_weights[n], w) for n, w in snapshot(backend, "b").items())
    assert all(torch.equal(b_grads[n], g) for n, g in grads(backend, "b").items())
    again = backend.forward_backward("b", ce(probe, forward_only=True)).loss_fn_outputs
    for before, after in zip(b_logprobs, again):
        np.testing.assert_array_equal(before["logprobs"], after["logprobs"])
    a_logprobs = backend.forward_backward("a", ce(probe, forward_only=True)).loss_fn_outputs
    assert not np.allclose(a_logprobs[0]["logprobs"], b_logprobs[0]["logprobs"])


def test_same_seed_same_init_and_delete(backend):
    backend.create_model("a", TINY_NAME, LoraConfig(rank=8, seed=42))
    backend.create_model("b", TINY_NAME, LoraConfig(rank=8, seed=42))
    backend.create_model("c", TINY_NAME, LoraConfig(rank=8, seed=43))
    a, b, c = (snapshot(backend, m) for m in "abc")
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)
    for model_id in "abc":
        backend.delete_model(model_id)
        assert not backend.has_model(model_id)
    backend.create_model("d", TINY_NAME, LoraConfig(rank=8, seed=42))
    assert all(torch.equal(a[n], w) for n, w in snapshot(backend, "d").items())
    assert train(backend, "d", sft_data(seed=0, count=1, length=8), steps=1)


def test_lora_targets_follow_the_config(backend):
    backend.create_model("attn", TINY_NAME, LoraConfig(rank=2, train_mlp=False, train_unembed=False))
    backend.create_model("rest", TINY_NAME, LoraConfig(rank=2, train_attn=False))
    attn, rest = snapshot(backend, "attn"), snapshot(backend, "rest")
    assert {n.split(".")[-3] for n in attn} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert {n.split(".")[-3] for n in rest} == {"gate_proj", "up_proj", "down_proj", "lm_head"}
    assert all(t.shape[0] == 2 for n, t in attn.items() if "lora_A" in n)


def test_cpu_adamw_takes_the_fused_kernel_and_updates_as_the_loop_does(backend):
    """The fused AdamW kernel on CPU (optim.py), also after loading a state saved with the loop; its updates
    equal torch's per-tensor loop within float rounding."""
    backend.create_model("m", TINY_NAME, LORA)
    randomize(backend, "m", seed=3)
    params = list(backend._run("m").params.values())
    loop = torch.optim.AdamW([p.detach().clone().requires_grad_() for p in params], lr=0.0, weight_decay=0.0)
    adam = AdamParams(learning_rate=1e-2, weight_decay=0.1, grad_clip_norm=0.0)
    optimizer = backend._run("m").optimizer
    optimizer.load_state_dict({**optimizer.state_dict(), "param_groups": [
        {**g, "fused": None} for g in optimizer.state_dict()["param_groups"]]})  # as a loop's state loads
    for step in range(3):
        backend.forward_backward("m", ce(sft_data(seed=step)))
        for mine, theirs in zip(params, loop.param_groups[0]["params"], strict=True):
            theirs.grad = mine.grad.clone()
        for group in loop.param_groups:
            group.update(lr=1e-2, weight_decay=0.1, betas=(adam.beta1, adam.beta2), eps=adam.eps)
        loop.step()
        backend.optim_step("m", adam)
        assert all(group["fused"] for group in optimizer.param_groups)
    for mine, theirs in zip(params, loop.param_groups[0]["params"], strict=True):
        torch.testing.assert_close(mine.detach(), theirs.detach(), rtol=1e-5, atol=1e-6)
