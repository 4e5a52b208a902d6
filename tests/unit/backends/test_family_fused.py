"""Every family: two runs in one `forward_backward_many` equal each run alone (logprobs, loss, LoRA gradients)
within 1e-5 in float32, whether the family's self-check let them share the pass (`fusion_check.py`) or sent
them in turns; and which families share it is pinned, so a family that stops fitting is noticed.
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import grads, randomize
from families import FAMILIES
from test_family_packing import BUDGET, _data
from test_torch_micro_batches import assert_within

from tx.types import ForwardBackwardInput, LoraConfig

# the self-check's verdict per family on CPU in float32 (transformers 5.19's torch paths)
EXPECTED_FUSES = dict.fromkeys(FAMILIES, True)


@pytest.fixture(scope="module")
def backend(family_model_dirs):
    from tx.backends.torch import logprobs
    from tx.backends.torch.backend import TorchBackend
    from tx.config.sections import TrainerSection

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logprobs, "CHUNK_LOGITS", 5 * 2048)
        yield TorchBackend(family_model_dirs, device="cpu",
                           settings=TrainerSection(micro_batch_tokens=2 * BUDGET))


@pytest.mark.parametrize("family", FAMILIES)
def test_two_runs_in_one_call_equal_each_alone(backend, family: str) -> None:
    loras = [LoraConfig(rank=4, seed=0), LoraConfig(rank=2, seed=1, train_mlp=False)]
    fused, alone = [f"{family}-f{i}" for i in range(2)], [f"{family}-a{i}" for i in range(2)]
    for i, lora in enumerate(loras):
        for model_id in (fused[i], alone[i]):
            backend.create_model(model_id, family, lora)
            randomize(backend, model_id, seed=10 + i)
    try:
        batches = [ForwardBackwardInput(data=_data("cross_entropy", seed=s), loss_fn="cross_entropy") for s in (0, 7)]
        together = backend.forward_backward_many(list(zip(fused, batches, strict=True)))
        assert backend._fusion[family] is EXPECTED_FUSES[family]
        for i, batch in enumerate(batches):
            got = together[i]
            assert not isinstance(got, Exception), got
            want = backend.forward_backward(alone[i], batch)
            for g, w in zip(got.loss_fn_outputs, want.loss_fn_outputs, strict=True):
                np.testing.assert_allclose(g["logprobs"], w["logprobs"], rtol=1e-5, atol=1e-5)
            assert got.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-5, abs=1e-5)
            got_grads, want_grads = grads(backend, fused[i]), grads(backend, alone[i])
            for name, want_grad in want_grads.items():
                assert want_grad is not None and got_grads[name] is not None, name
                assert_within(got_grads[name], want_grad, name)
    finally:
        for model_id in fused + alone:
            backend.delete_model(model_id)
