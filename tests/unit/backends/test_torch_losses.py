"""Each loss against a hand computation: its value, and its gradient through the model.

The gradient check uses the fact that for any per-token loss ℓ(logp), the model gradient equals
that of cross_entropy with weights w = -∂ℓ/∂logp (cross_entropy's gradient is -Σ w·∇logp).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from backend_helpers import TINY_NAME, ce, datum, grads, randomize, sequences

from tx.backends import losses
from tx.backends.torch.ops import TORCH_OPS
from tx.types import ForwardBackwardInput, LoraConfig, ProvenanceSpan, UserError


def _hand(name: str, logp, q, adv, config) -> tuple[np.ndarray, np.ndarray]:
    """(per-token loss, -∂loss/∂logp) written out in numpy."""
    low, high = config.get("clip_low_threshold", 0.2), config.get("clip_high_threshold", 0.2)
    r = np.exp(logp - q)
    clipped = np.clip(r, 1 - low, 1 + high)
    if name == "importance_sampling":
        return -r * adv, r * adv
    if name == "ppo":
        unclipped_wins = r * adv <= clipped * adv
        return -np.minimum(r * adv, clipped * adv), np.where(unclipped_wins, r * adv, 0.0)
    if name == "cispo":
        return -clipped * adv * logp, clipped * adv
    if name == "dro":
        beta = config.get("beta", 0.05)
        return -(adv * logp - beta / 2 * (logp - q) ** 2), adv - beta * (logp - q)
    raise AssertionError(name)


def _hand_gspo(logp, q, adv, in_ratio, config) -> tuple[np.ndarray, np.ndarray]:
    """One ratio per datum: s = exp(mean over the masked tokens of logp - q), with each token's gradient."""
    low, high = config.get("clip_low_threshold", 0.2), config.get("clip_high_threshold", 0.2)
    s = np.exp((logp - q)[in_ratio != 0].mean())
    clipped = np.clip(s, 1 - low, 1 + high)
    unclipped_wins = s * adv <= clipped * adv
    return -np.minimum(s * adv, clipped * adv), np.where(unclipped_wins, s * adv, 0.0)


def _hand_stable_reinforce(logp, q, adv, sampled, config) -> tuple[np.ndarray, np.ndarray]:
    kl_coeff = config.get("kl_coeff", 0.0)
    r = np.exp(logp - q)
    weight = np.minimum(r, 1.0)
    loss = -weight * adv * logp + kl_coeff * sampled * (r - 1 - (logp - q))
    return loss, weight * adv - kl_coeff * sampled * (r - 1)


def test_cross_entropy_formula():
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    weights = torch.tensor([[1.0, -0.5, 0.25]])
    got = losses.cross_entropy(TORCH_OPS, logp, {"weights": weights}, {})
    torch.testing.assert_close(got, torch.tensor([[1.0, -1.0, 0.125]]))


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("importance_sampling", {}),
        ("ppo", {}),
        ("ppo", {"clip_low_threshold": 0.1, "clip_high_threshold": 0.3}),
        ("cispo", {"clip_low_threshold": 0.05, "clip_high_threshold": 0.1}),
        ("dro", {}),
        ("dro", {"beta": 0.5}),
    ],
)
def test_rl_loss_value_and_gradient(backend, name, config):
    backend.create_model("m", TINY_NAME, LoraConfig(rank=4, seed=0))
    randomize(backend, "m", seed=1)
    seqs = sequences(seed=2, count=2, length=13)
    probe = [datum(s[:-1], target_tokens=s[1:]) for s in seqs]
    forward = backend.forward_backward("m", ce(probe, forward_only=True))
    logps = [o["logprobs"] for o in forward.loss_fn_outputs]
    rng = np.random.default_rng(3)
    # sampler logprobs near the trainer's, so ratios land both inside and outside the clip range
    qs = [(lp + rng.normal(scale=0.3, size=lp.shape)).astype(np.float32) for lp in logps]
    advs = [rng.normal(size=lp.shape).astype(np.float32) for lp in logps]
    data = [datum(s[:-1], target_tokens=s[1:], logprobs=q, advantages=a) for s, q, a in zip(seqs, qs, advs)]

    hand = [_hand(name, lp.astype(np.float64), q, a, config) for lp, q, a in zip(logps, qs, advs)]
    result = _check_against_hand(backend, seqs, data, name, config, hand)
    for out, lp in zip(result.loss_fn_outputs, logps):
        np.testing.assert_allclose(out["logprobs"], lp, rtol=1e-6)


def test_ppo_clipping_happens_in_the_test_data():
    r = torch.tensor([0.5, 1.0, 1.5])
    adv = torch.tensor([1.0, 1.0, 1.0])
    inputs = {"logprobs": torch.zeros(3), "advantages": adv}
    got = losses.ppo(TORCH_OPS, torch.log(r), inputs, {"clip_low_threshold": 0.2, "clip_high_threshold": 0.2})
    torch.testing.assert_close(got, torch.tensor([-0.5, -1.0, -1.2]))


def test_multi_target_cross_entropy(backend):
    backend.create_model("m", TINY_NAME, LoraConfig(rank=4, seed=0))
    tokens = [3, 4, 5, 6]
    targets = np.array([[4, 9], [5, 9], [6, 9], [7, 9]])
    weights = np.array([[1.0, 0.5], [1.0, 0.0], [0.0, -1.0], [2.0, 1.0]])
    result = backend.forward_backward("m", ce([datum(tokens, target_tokens=targets, weights=weights)]))
    logp = result.loss_fn_outputs[0]["logprobs"]
    assert logp.shape == (4, 2)
    single = backend.forward_backward(
        "m", ce([datum(tokens, target_tokens=targets[:, 1])], forward_only=True)
    ).loss_fn_outputs[0]["logprobs"]
    np.testing.assert_allclose(logp[:, 1], single, rtol=1e-5)
    assert result.metrics["loss:sum"] == pytest.approx(-(weights * logp).sum(), rel=1e-5)


def _rl_batch(backend, seed: int):
    """Two datums of 12 target rows; the first 4 rows are prompt (advantage 0), the rest sampled."""
    backend.create_model("m", TINY_NAME, LoraConfig(rank=4, seed=0))
    randomize(backend, "m", seed=1)
    seqs = sequences(seed=seed, count=2, length=13)
    probe = [datum(s[:-1], target_tokens=s[1:]) for s in seqs]
    logps = [o["logprobs"] for o in backend.forward_backward("m", ce(probe, forward_only=True)).loss_fn_outputs]
    rng = np.random.default_rng(seed + 1)
    sampled = np.array([0.0] * 4 + [1.0] * 8, dtype=np.float32)
    qs = [np.where(sampled > 0, lp + rng.normal(scale=0.2, size=lp.shape), 0.0).astype(np.float32) for lp in logps]
    advs = [(sampled * rng.normal()).astype(np.float32) for _ in logps]
    return seqs, logps, qs, advs, sampled


def _check_against_hand(backend, seqs, data, name, config, hand):
    """The loss `name` on `data` has the hand-computed value, and the gradient of cross-entropy weighted by the
    hand-computed per-token weights (on a fresh model with the same weights); returns the loss's result."""
    result = backend.forward_backward("m", ForwardBackwardInput(data, name, dict(config)))
    rl_grads = grads(backend, "m")
    assert result.metrics["loss:sum"] == pytest.approx(sum(h[0].sum() for h in hand), rel=1e-4, abs=1e-4)
    backend.delete_model("m")
    backend.create_model("m", TINY_NAME, LoraConfig(rank=4, seed=0))
    randomize(backend, "m", seed=1)
    equivalent = [datum(s[:-1], target_tokens=s[1:], weights=h[1]) for s, h in zip(seqs, hand)]
    backend.forward_backward("m", ce(equivalent))
    for key, want in grads(backend, "m").items():
        # two float32 passes whose per-token weights differ by float32 rounding (the loss's autograd against the
        # hand's float64 values): their gradients differ by up to ~3e-6 of the tensor's scale, more than 1e-6
        # on an element that sums to near zero; one token's weight off by 1% fails every case here
        atol = max(1e-6, 1e-5 * float(want.abs().max()))
        torch.testing.assert_close(rl_grads[key], want, rtol=1e-3, atol=atol)
    return result


@pytest.mark.parametrize("config", [{}, {"clip_low_threshold": 0.01, "clip_high_threshold": 0.02}])
def test_gspo_value_and_gradient(backend, config):
    seqs, logps, qs, advs, sampled = _rl_batch(backend, seed=5)
    data = [
        datum(s[:-1], target_tokens=s[1:], logprobs=q, advantages=a, sequence_ratio_mask=sampled)
        for s, q, a in zip(seqs, qs, advs)
    ]
    hand = [_hand_gspo(lp.astype(np.float64), q, a, sampled, config) for lp, q, a in zip(logps, qs, advs)]
    _check_against_hand(backend, seqs, data, "gspo", config, hand)


def test_gspo_ratio_is_one_per_sequence():
    logp = torch.tensor([[[-1.0], [-2.0], [-3.0]], [[-1.0], [-1.0], [0.0]]])
    inputs = {
        "logprobs": torch.tensor([[[-1.5], [-2.5], [-9.0]], [[-1.0], [-1.0], [0.0]]]),
        "advantages": torch.ones(2, 3, 1),
        "sequence_ratio_mask": torch.tensor([[[1.0], [1.0], [0.0]], [[1.0], [1.0], [1.0]]]),
    }
    got = losses.gspo(TORCH_OPS, logp, inputs, {"clip_low_threshold": 1.0, "clip_high_threshold": 10.0})
    # datum 0: mean log-ratio over its two masked tokens is 0.5, so every token carries exp(0.5)
    torch.testing.assert_close(got[0, :, 0], -torch.full((3,), float(np.exp(0.5))))
    torch.testing.assert_close(got[1, :, 0], -torch.ones(3))


@pytest.mark.parametrize("config", [{}, {"kl_coeff": 0.5}])
def test_stable_reinforce_value_and_gradient(backend, config):
    seqs, logps, qs, advs, sampled = _rl_batch(backend, seed=7)
    spans = (ProvenanceSpan("s:0:0", 1, 4, sampled=False), ProvenanceSpan("s:0:0", 0, 8, sampled=True))
    data = [
        replace(datum(s[:-1], target_tokens=s[1:], logprobs=q, advantages=a), loss_fn_input_spans=spans)
        for s, q, a in zip(seqs, qs, advs)
    ]
    hand = [_hand_stable_reinforce(lp.astype(np.float64), q, a, sampled, config) for lp, q, a in zip(logps, qs, advs)]
    _check_against_hand(backend, seqs, data, "stable_reinforce", config, hand)


def test_new_losses_refuse_bad_inputs(backend):
    backend.create_model("m", TINY_NAME, LoraConfig(rank=4, seed=0))
    tokens, targets = [1, 2, 3, 4], [2, 3, 4, 5]
    rl = {"logprobs": np.zeros(4), "advantages": np.ones(4)}
    cases = [
        ("gspo", datum(tokens, target_tokens=targets, **rl), {}, "sequence_ratio_mask"),
        ("gspo", datum(tokens, target_tokens=targets, **rl, sequence_ratio_mask=np.ones(4)),
         {"clip_low_threshold": -1.0}, "clip_low_threshold"),
        ("stable_reinforce", datum(tokens, target_tokens=targets, **rl), {}, "needs provenance"),
        ("stable_reinforce", replace(datum(tokens, target_tokens=targets, **rl), loss_fn_input_spans=(
            ProvenanceSpan("s", 0, 3, sampled=True),)), {}, "cover 3 rows"),
        ("stable_reinforce", replace(datum(tokens, target_tokens=targets, **rl), loss_fn_input_spans=(
            ProvenanceSpan("s", 1, 1, sampled=False), ProvenanceSpan("s", 0, 3, sampled=True))), {},
         "row 0"),
        ("stable_reinforce", replace(datum(tokens, target_tokens=targets, **rl), loss_fn_input_spans=(
            ProvenanceSpan("s", 0, 4, sampled=True),)), {"kl_coeff": -0.1}, "kl_coeff"),
        ("stable_reinforce", datum(tokens, target_tokens=targets, **rl), {"beta": 0.1}, "not used by"),
    ]
    for name, bad, config, message in cases:
        with pytest.raises(UserError, match=message):
            backend.forward_backward("m", ForwardBackwardInput([bad], name, config))
