"""`TorchBackend.base_logprobs`: the base model's forward that the engines' self-check compares with
(tx/inference/manager/selfcheck.py): the trainer's own logprobs of the same tokens, and never an adapter's.
The other trainers' are checked against this one with their own fixtures: the trainer workers in
test_torch_workers.py, the JAX trainer in test_jax_backend.py."""

from __future__ import annotations

import numpy as np
from backend_helpers import TINY_NAME, ce, core_reference, datum, randomize

from tx.models.agreement import FLOAT32_TOLERANCE
from tx.types import LoraConfig

TOKENS = [[3, 9, 27, 81, 12, 44, 7, 5], [100, 2, 2, 57, 8]]


def trainer_logprobs(backend, model_id: str) -> list[np.ndarray]:
    data = [datum(t[:-1], target_tokens=t[1:]) for t in TOKENS]
    result = backend.forward_backward(model_id, ce(data, forward_only=True))
    return [out["logprobs"] for out in result.loss_fn_outputs]


def test_base_logprobs_are_the_trainers_with_no_adapter_and_ignore_loaded_adapters(backend):
    before = backend.base_logprobs(TINY_NAME, TOKENS)
    assert before.tolerance == FLOAT32_TOLERANCE
    assert [len(row) for row in before.logprobs] == [len(t) - 1 for t in TOKENS]
    backend.create_model("m", TINY_NAME, LoraConfig(rank=8, seed=0))  # a fresh adapter: B = 0, the base's
    for got, want in zip(before.logprobs, trainer_logprobs(backend, "m")):
        np.testing.assert_allclose(got, want, atol=1e-5)
    randomize(backend, "m", seed=1, scale=0.2)
    adapted = trainer_logprobs(backend, "m")
    after = backend.base_logprobs(TINY_NAME, TOKENS)
    assert max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(before.logprobs, adapted)) > 1e-2
    np.testing.assert_allclose(np.concatenate(after.logprobs), np.concatenate(before.logprobs), atol=1e-6)
    assert trainer_logprobs(backend, "m")[0].tolist() == adapted[0].tolist()  # the adapter is back on after


def test_the_core_hands_the_trainers_base_forward_to_the_engines_check(backend):
    """`tx/core/engine_check.py` runs it on the training thread and hands over the same rows and bound."""
    got = core_reference(backend, TINY_NAME, TOKENS)
    assert got == backend.base_logprobs(TINY_NAME, TOKENS)
