"""The Dimuon optimizer through the SDK: chosen at create_model, stepped with DimuonParams, its loss falling, its
state in save_state so that a resumed run equals the uninterrupted one exactly; refused clearly where it does not
run (the JAX trainer)."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from conftest import Trained
from sdk_datums import sft_datum
from tinker import types
from txserver import TxServer

STEPS, SAVE_AT = 8, 4
PARAMS = types.DimuonParams(learning_rate=0.02, beta1=0.9, grad_clip_norm=1.0)


def steps(tc: tinker.TrainingClient, data: list[types.Datum], count: int) -> list[float]:
    losses = []
    for _ in range(count):
        fb = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(PARAMS).result()
        losses.append(fb.result().metrics["loss:sum"])
    return losses


def test_dimuon_trains_and_resumes_exactly(service_client: tinker.ServiceClient, trained: Trained) -> None:
    data = [sft_datum(trained.tokens), sft_datum(trained.tokens[::-1])]
    tc = service_client.create_lora_training_client("tiny-qwen3", rank=4, seed=1,
                                                    optimizer=types.DimuonOptimizerConfig()).result()
    assert tc.get_info().optimizer_config.type == "dimuon"
    first = steps(tc, data, SAVE_AT)
    state = tc.save_state("dimuon-half").result().path
    rest = steps(tc, data, STEPS - SAVE_AT)
    losses = first + rest
    assert losses[-1] < 0.8 * losses[0], losses  # it learns
    final = tc.forward(data, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()

    resumed = service_client.create_training_client_from_state_with_optimizer(state).result()
    assert resumed.get_info().optimizer_config.type == "dimuon"
    assert steps(resumed, data, STEPS - SAVE_AT) == rest  # exactly the uninterrupted run
    again = resumed.forward(data, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_array_equal(again, final)

    info = trained.rest.get_weights_info_by_tinker_path(state).result()
    assert info.optimizer_config.type == "dimuon"
    with pytest.raises(tinker.BadRequestError, match="optim_step takes DimuonParams"):
        resumed.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    weights_only = service_client.create_training_client_from_state(state).result()  # a new AdamW run
    assert weights_only.get_info().optimizer_config.type == "adamw"
    with pytest.raises(tinker.BadRequestError, match="optim_step takes AdamParams"):
        weights_only.optim_step(PARAMS).result()


def test_jax_trainer_refuses_dimuon_at_create_model(jax_server: TxServer) -> None:
    with jax_server.client() as service:
        with pytest.raises(tinker.BadRequestError, match="JAX trainer"):
            service.create_lora_training_client("tiny-qwen3", rank=4, optimizer=types.DimuonOptimizerConfig()).result()
