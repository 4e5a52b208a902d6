"""Every family, every loss: a datum's logprobs, loss and LoRA gradients are the same packed with others (or in
padded rows, where the family's self-check chose them) as run alone, within 1e-5 in float32.

The backend cuts a request into micro-batches of 24 tokens and lays them into rows as the base model's
packing self-check decided (`tx/backends/torch/packing.py`); the reference runs each datum alone through the
same PEFT model (batch of one, no padding, full logits), with the same loss formula, and sums.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from backend_helpers import datum, randomize, sequences, snapshot
from families import FAMILIES
from test_torch_micro_batches import assert_within

from tx.backends.losses import get_loss
from tx.backends.torch.batch import prepare_data
from tx.backends.torch.ops import TORCH_OPS
from tx.types import Datum, ForwardBackwardInput, LoraConfig, ProvenanceSpan

LENGTHS = (7, 9, 30, 5, 12, 6)
BUDGET = 24
LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce")
# the self-check's choice per family on CPU in float32 (transformers 5.19's torch paths)
EXPECTED_PACKING = {"tiny": "packed", "llama": "packed", "gemma3": "packed", "qwen3_moe": "packed",
                    "deepseek_v3": "packed", "gpt_oss": "packed_masks", "qwen3_5": "padded",
                    "qwen3_5_moe": "padded", "qwen3_5_vl": "padded", "qwen3_5_moe_vl": "padded",
                    "olmo3": "packed", "nemotron_h": "padded", "deepseek_v4": "padded", "glm_moe_dsa": "packed",
                    "qwen3_vl_moe": "padded", "inkling": "padded", "inkling2": "padded",  # these two: 5.23
                    "mistral_large4": "packed"}


@pytest.fixture(scope="module")
def backend(family_model_dirs):
    from tx.backends.torch import logprobs
    from tx.backends.torch.backend import TorchBackend
    from tx.config.sections import TrainerSection

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logprobs, "CHUNK_LOGITS", 5 * 2048)  # the head runs 5 positions at a time
        yield TorchBackend(family_model_dirs, device="cpu",
                           settings=TrainerSection(micro_batch_tokens=BUDGET))


def _data(loss_name: str, seed: int = 0) -> list[Datum]:
    rng = np.random.default_rng(seed)
    data = []
    for i, length in enumerate(LENGTHS):
        seq = sequences(seed + i, 1, length + 1)[0]
        shape = (length,)
        if loss_name == "cross_entropy":
            inputs = {"weights": rng.normal(size=shape)}
        else:  # sampler logprobs near the model's (~ -7.6 for 2048 tokens), so ratios stay near 1
            inputs = {"logprobs": -7.6 + 0.3 * rng.normal(size=shape), "advantages": rng.normal(size=shape)}
        if loss_name == "gspo":
            inputs["sequence_ratio_mask"] = rng.integers(0, 2, size=shape)
        item = datum(seq[:-1], target_tokens=seq[1:], **inputs)
        if loss_name == "stable_reinforce":
            item.loss_fn_input_spans = (ProvenanceSpan(f"s{i}", 0, length, sampled=True),)
        data.append(item)
    return data


def _alone(backend, model_id: str, data: list[Datum], loss_name: str):
    """(logprobs per datum, summed loss, grads by PEFT name): each datum through the run's model by itself."""
    run = backend._runs[model_id]  # the run's own PEFT model: the reference shares only its weights
    host = backend._hosts[run.base_model]
    host.activate(run.adapter)
    loss_fn = get_loss(loss_name)
    config = loss_fn.resolve_config({})
    items = prepare_data(data, loss_fn, backend.base_model_info(run.base_model))
    outputs, total = [], 0.0
    grads = {name: torch.zeros_like(p) for name, p in run.params.items()}
    for item in items:
        ids = torch.tensor(item.expanded.token_ids)[None]
        logits = host.model(input_ids=ids, use_cache=False).logits.float()
        targets = torch.from_numpy(item.arrays["target_tokens"]).reshape(1, -1, 1)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets)
        inputs = {k: torch.from_numpy(v).reshape(1, -1, 1) for k, v in item.arrays.items() if k != "target_tokens"}
        loss = loss_fn.compute(TORCH_OPS, logp, inputs, config).sum()
        for (name, param), grad in zip(run.params.items(), torch.autograd.grad(loss, list(run.params.values()),
                                                                              allow_unused=True)):
            grads[name] += 0 if grad is None else grad
        outputs.append(logp[0, :, 0].detach().numpy())
        total += float(loss.detach())
    return outputs, total, grads


CASES = [  # every family with cross_entropy in the quick suite; the other losses (~6 min on 2 loaded cores) slow
    pytest.param(family, loss_name, marks=() if loss_name == "cross_entropy" else pytest.mark.slow)
    for family in FAMILIES for loss_name in LOSSES
]


@pytest.mark.parametrize(("family", "loss_name"), CASES)
def test_packed_equals_alone(backend, family: str, loss_name: str) -> None:
    model_id = f"{family}-{loss_name}"
    backend.create_model(model_id, family, LoraConfig(rank=4, seed=0))
    randomize(backend, model_id, seed=1)
    try:
        assert backend._hosts[family].packing == EXPECTED_PACKING[family]
        data = _data(loss_name)
        before = snapshot(backend, model_id)
        result = backend.forward_backward(model_id, ForwardBackwardInput(data=data, loss_fn=loss_name))
        want_logprobs, want_loss, want_grads = _alone(backend, model_id, data, loss_name)
        assert all(torch.equal(before[n], t) for n, t in backend.iter_trainable_weights(model_id))
        for got, want in zip(result.loss_fn_outputs, want_logprobs, strict=True):
            np.testing.assert_allclose(got["logprobs"], want, rtol=1e-5, atol=1e-5)
        assert result.metrics["loss:sum"] == pytest.approx(want_loss, rel=1e-5, abs=1e-5)
        got_grads = backend.gradients(model_id)
        assert set(got_grads) == set(want_grads)
        for name, want in want_grads.items():
            got = got_grads[name]
            assert got is not None, name
            assert_within(got, want, name)
    finally:
        backend.delete_model(model_id)
