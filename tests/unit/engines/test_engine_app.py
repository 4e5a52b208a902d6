"""`engine_app`: the one route table every engine kind serves, driven in process over a fake backend (no
engine start). The live engines' routes are covered by the engine tests; this checks the table, the secret,
the error policy and where each shape of operation runs."""

from __future__ import annotations

import inspect
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tx.inference import protocol as p
from tx.inference.engines.app import EngineBackend, engine_app
from tx.inference.engines.config import EngineProcessConfig
from tx.inference.engines.http import UpstreamError
from tx.types import NotFoundError, UserError

SECRET = "app-test-secret"
GUARD = {p.SECRET_HEADER: SECRET}


class FakeBackend:
    """An `EngineBackend` with both shapes of operation the real ones have: plain methods that may block (the
    embedded engine's) and coroutines (vLLM's). It records the thread each one ran on."""

    def __init__(self) -> None:
        self.config = EngineProcessConfig(model_dir=Path("unused"), cluster_secret=SECRET)
        self.ran_on: dict[str, int] = {}
        self.fail: Exception | None = None

    def _state(self, name: str) -> p.StateResponse:
        self.ran_on[name] = threading.get_ident()
        if self.fail is not None:
            raise self.fail
        return p.StateResponse(paused=name == "pause", sleeping_level=0)

    def health(self) -> p.HealthResponse:
        return p.HealthResponse(paused=False, sleeping_level=0, model="fake")

    async def generate(self, request: p.GenerateRequest) -> p.GenerateResponse:
        self._state("generate")
        return p.GenerateResponse(sequences=[p.GeneratedSequence(token_ids=[1], logprobs=[0.0],
                                                                 stop_reason="length")])

    async def tokenize(self, request: p.TokenizeRequest) -> p.TokenizeResponse:
        return p.TokenizeResponse(token_ids=[len(request.text)])

    def pause(self, mode: p.PauseMode) -> p.StateResponse:
        return self._state("pause")

    async def resume(self) -> p.StateResponse:
        return self._state("resume")

    def sleep(self, level: int, mode: p.PauseMode) -> p.StateResponse:
        return self._state("sleep")

    def wake_up(self, tags: list[p.WakeTag] | None) -> p.StateResponse:
        return self._state("wake_up")

    def init_transfer(self, init) -> p.HealthResponse:
        return self.health()

    def update_weights(self, request: p.WeightsUpdateRequest) -> p.WeightsUpdateResponse:
        raise NotImplementedError

    def update_weights_ipc(self, request: p.IpcWeightsUpdateRequest) -> p.WeightsUpdateResponse:
        raise NotImplementedError

    def finish_weights(self, request: p.WeightsFinishRequest) -> p.HealthResponse:
        return self.health()

    def delete_adapter(self, name: str) -> p.HealthResponse:
        raise NotFoundError(f"adapter {name!r} is not loaded")


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def client(backend: FakeBackend):
    with TestClient(engine_app(backend), raise_server_exceptions=False) as client:
        yield client


def test_the_app_serves_every_route_of_the_contract(backend):
    contract = {value for name, value in vars(p).items() if name.startswith("ROUTE_")}
    served = {route.path for route in engine_app(backend).routes} - {"/openapi.json", "/docs", "/redoc",
                                                                    "/docs/oauth2-redirect"}
    assert served == contract


@pytest.mark.parametrize("backend_class", ["embedded", "vllm"])
def test_each_engine_implements_every_operation(backend_class):
    if backend_class == "embedded":
        from tx.inference.engines.embedded.engine import EmbeddedEngine as cls
    else:
        from tx.inference.engines.vllm.server import VllmEngine as cls
    for name, spec in vars(EngineBackend).items():
        if name.startswith("_") or not callable(spec):
            continue
        assert callable(getattr(cls, name, None)), f"{cls.__name__} lacks {name}"
        wanted = list(inspect.signature(spec).parameters)
        assert list(inspect.signature(getattr(cls, name)).parameters) == wanted, name


def test_plain_operations_run_in_the_thread_pool_and_coroutines_on_the_loop(client, backend):
    assert client.post(p.ROUTE_PAUSE, json={"mode": "keep"}, headers=GUARD).json()["paused"] is True
    assert client.post(p.ROUTE_RESUME, headers=GUARD).status_code == 200
    assert client.post(p.ROUTE_GENERATE, json={"prompt_token_ids": [3], "max_tokens": 1},
                       headers=GUARD).json()["sequences"][0]["token_ids"] == [1]
    loop_thread = backend.ran_on["resume"]
    assert backend.ran_on["generate"] == loop_thread
    assert backend.ran_on["pause"] != loop_thread  # a blocking pause never stalls the loop


def test_every_route_but_health_needs_the_secret(client):
    assert client.get(p.ROUTE_HEALTH).json()["model"] == "fake"
    assert client.post(p.ROUTE_RESUME).status_code == 401
    assert client.post(p.ROUTE_RESUME, headers={p.SECRET_HEADER: "wrong-secret"}).status_code == 401
    assert client.post(p.ROUTE_TOKENIZE, json={"text": "abc"}, headers=GUARD).json() == {"token_ids": [3]}


@pytest.mark.parametrize("error, status", [
    (UserError("bad level"), 400), (UpstreamError(503, "vLLM is busy"), 503), (RuntimeError("boom"), 500),
])
def test_errors_answer_json_with_the_policys_status(client, backend, error, status):
    backend.fail = error
    response = client.post(p.ROUTE_SLEEP, json={"level": 1}, headers=GUARD)
    assert response.status_code == status
    assert str(error) in response.json()["detail"]


def test_a_missing_adapter_is_404(client):
    response = client.delete(p.ROUTE_ADAPTER.format(name="a1"), headers=GUARD)
    assert response.status_code == 404 and "a1" in response.json()["detail"]
