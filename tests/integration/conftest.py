from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import tinker
from sdk_datums import sft_datum
from tinker import types
from txserver import API_KEY, TxServer


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """One tx server for the integration tests, on the built-in tiny model."""
    with TxServer(tmp_path_factory.mktemp("tx-data"), args=["--seq-gap-timeout-s", "3"],
                  env={"TX_JANITOR_INTERVAL_S": "1"}) as srv:
        yield srv


@pytest.fixture(scope="session")
def workers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """A tx server whose trainer runs on 2 worker processes (gloo; the tiny base held whole on each, the
    default); they start on the first run. Its clients send their API key on every call (no token exchange),
    so that way of signing in is covered too."""
    args = ["--seq-gap-timeout-s", "3", "--trainer-workers", "2", "--no-jwt-auth"]
    with TxServer(tmp_path_factory.mktemp("tx-workers"), args=args) as srv:
        yield srv


ALICE, BOB, OPERATOR = "tml-alice", "tml-bob", "tml-operator"
TTL_S = 4


@pytest.fixture(scope="session")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """Two tenants and an operator; tokens live TTL_S seconds (so the SDK renews one on every call)."""
    args = ["--api-key", ALICE, "--api-key", BOB, "--operator-key", OPERATOR, "--jwt-ttl-s", str(TTL_S)]
    with TxServer(tmp_path_factory.mktemp("tx-keyed"), args=args) as srv:
        yield srv


@pytest.fixture(scope="session")
def jax_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """A `tx serve --backend jax` (the [jax] extra), for the tests parametrised with it."""
    pytest.importorskip("jax")
    args = ["--backend", "jax", "--seq-gap-timeout-s", "3", "--no-engine-colocate"]
    with TxServer(tmp_path_factory.mktemp("tx-jax"), args=args) as srv:
        yield srv


@pytest.fixture
def service_client(server: TxServer) -> Iterator[tinker.ServiceClient]:
    with server.client() as client:
        yield client


@dataclass
class Trained:
    """A LoRA run trained a few steps (so its adapter is far from the identity), with a saved state."""

    service: tinker.ServiceClient
    tc: tinker.TrainingClient
    rest: tinker.RestClient
    state_path: str
    tokens: list[int]

    def trainer_logprobs(self) -> np.ndarray:
        out = self.tc.forward([sft_datum(self.tokens)], "cross_entropy").result()
        return out.loss_fn_outputs[0]["logprobs"].to_numpy()


@pytest.fixture(scope="session")
def trained(server: TxServer) -> Iterator[Trained]:
    with server.client() as service:
        tc = service.create_lora_training_client("tiny-qwen3", rank=4, seed=0).result()
        tokens = np.random.default_rng(7).integers(10, 1990, size=24).tolist()
        for _ in range(3):
            tc.forward_backward([sft_datum(tokens)], "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        rest = tinker.RestClient(base_url=server.url, api_key=API_KEY)
        yield Trained(service, tc, rest, tc.save_state("trained").result().path, tokens)
