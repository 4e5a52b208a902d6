"""Runs, sessions and checkpoints survive a server restart; training resumes from a checkpoint."""

from __future__ import annotations

import os

import pytest
from tinker import types

from txserver import TxServer


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_args(request) -> list[str]:
    if request.param == "sqlite":
        return []
    url = os.environ.get("TX_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("set TX_TEST_POSTGRES_URL to run against PostgreSQL")
    return ["--database-url", url]


def test_state_survives_restart(tmp_path, store_args: list[str]) -> None:
    server = TxServer(tmp_path / "data", args=store_args)
    with server, server.client() as client:
        tc = client.create_lora_training_client("tiny-qwen3", rank=4).result()
        data = [types.Datum(model_input=types.ModelInput.from_ints([3, 4, 5, 6]),
                            loss_fn_inputs={"target_tokens": [4, 5, 6, 7], "weights": [1.0] * 4})]
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        path = tc.save_state("before-restart").result().path
        loss = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
        model_id = tc.model_id

    with server, server.client() as client:
        rest = client.create_rest_client()
        run = rest.get_training_run(model_id).result()
        assert run.base_model == "tiny-qwen3" and run.lora_rank == 4
        paths = [c.tinker_path for c in rest.list_checkpoints(model_id).result().checkpoints]
        assert path in paths
        resumed = client.create_training_client_from_state_with_optimizer(path).result()
        assert resumed.forward(data, "cross_entropy").result().metrics["loss:sum"] == loss
