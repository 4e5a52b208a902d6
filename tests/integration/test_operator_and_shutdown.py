"""A server with API keys: its operator route needs an operator key; and `tx serve` stops quickly and cleanly
(SIGTERM) with an engine up and a training step in flight."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import tinker
from sdk_datums import sft_datum
from tinker import types
from txserver import API_KEY, TxServer, abandon

OPERATOR_KEY = "operator-key-" + "k" * 16
ENGINES = "/api/v1/tx/engines"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    with TxServer(tmp_path_factory.mktemp("tx-keyed"),
                  args=["--api-key", API_KEY, "--operator-key", OPERATOR_KEY, "--no-engine-colocate"]) as srv:
        yield srv


def test_the_engines_route_needs_an_operator_key(keyed_server: TxServer) -> None:
    url = keyed_server.url + ENGINES
    assert httpx.get(url, headers={"X-API-Key": API_KEY}).status_code == 403  # a tenant's key
    assert httpx.get(url).status_code == 401  # no key
    answer = httpx.get(url, headers={"X-API-Key": OPERATOR_KEY})
    assert answer.status_code == 200 and answer.json()["groups"][0]["state"] == "absent"


def test_the_engines_route_is_open_on_loopback_without_any_keys(server: TxServer) -> None:
    assert httpx.get(server.url + ENGINES).status_code == 200


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_with_an_engine_up_and_a_step_in_flight_stops_in_seconds(keyed_server: TxServer) -> None:
    client = tinker.ServiceClient(base_url=keyed_server.url, api_key=API_KEY)
    tc = client.create_lora_training_client("tiny-qwen3", rank=4).result()
    tc.save_weights_and_get_sampling_client().result().sample(
        types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=2)).result()
    (engine,) = [e for g in httpx.get(keyed_server.url + ENGINES, headers={"X-API-Key": OPERATOR_KEY})
                 .json()["groups"] for e in g["engines"]]
    tokens = list(range(10, 410))
    datum = sft_datum(tokens)
    steps = threading.Thread(target=lambda: [tc.forward_backward([datum] * 4, "cross_entropy") for _ in range(20)],
                             daemon=True)
    steps.start()
    time.sleep(1.0)  # steps queued and one running
    assert keyed_server.proc is not None
    started = time.monotonic()
    os.killpg(keyed_server.proc.pid, signal.SIGTERM)
    keyed_server.proc.wait(30)
    took = time.monotonic() - started
    abandon(client)
    assert took < 5.0, f"tx serve took {took:.1f} s to stop:\n{keyed_server.log()[-3000:]}"
    # uvicorn shuts down, then exits by the signal it caught
    assert keyed_server.proc.returncode in (0, -signal.SIGTERM), keyed_server.proc.returncode
    deadline = time.monotonic() + 2
    while alive(engine["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(engine["pid"]), "the engine outlived the server"
    assert "training and engines stopped" in keyed_server.log()
