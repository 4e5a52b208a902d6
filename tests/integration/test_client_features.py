"""What the server tells clients, through the SDK: client/config's flags as tx means them, client/dynamic_config
(abandoned samples are cancelled on the server, and on its engine), join_sampling_session numbering unpickled SamplingClients, and
get_server_capabilities."""

from __future__ import annotations

import pickle
import time

import httpx
import pytest
import tinker
from abandon import assert_cancelled, engine_health, wait_until
from prometheus_client.parser import text_string_to_metric_families
from tinker import types
from txserver import API_KEY, TxServer

PROMPT = types.ModelInput.from_ints(list(range(20, 40)))


def requests_to(server: TxServer, route: str) -> float:
    text = httpx.get(f"{server.url}/metrics", headers={"X-API-Key": API_KEY}).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "tx_http_requests_total" and s.labels["route"] == route and s.labels["status"] == "200")


def test_client_config_says_what_this_server_does(server: TxServer) -> None:
    config = httpx.post(f"{server.url}/api/v1/client/config", json={"sdk_version": "0.38.0"},
                        headers={"X-API-Key": API_KEY}).json()
    assert config["pjwt_auth_enabled"] and config["sample_join_sampling_session"]
    assert config["custom_loss_server_side"] and not config["use_pyqwest_transport"]
    assert config["sample_max_concurrent_requests"] == 1024  # the server's sampling queue (--sampling-max-queue)
    capabilities = tinker.RestClient(base_url=server.url, api_key=API_KEY).get_server_capabilities().result()
    [model] = capabilities.supported_models
    assert (model.model_name, model.max_context_length, model.trainable, model.sampleable) == (
        "tiny-qwen3", 2048, True, True)  # the built-in model's context


def test_unpickled_sampling_clients_join_the_session(server: TxServer) -> None:
    with server.client() as service:
        sampler = service.create_sampling_client(base_model="tiny-qwen3").result()
        params = types.SamplingParams(max_tokens=3, seed=1)
        original = sampler.sample(PROMPT, 1, params).result()
        clones = [pickle.loads(pickle.dumps(sampler)) for _ in range(2)]
        for clone in clones:
            assert clone.sample(PROMPT, 1, params).result().sequences[0].tokens == original.sequences[0].tokens
        assert sorted(clone._cloned_sampler_id for clone in clones) == [1, 2]  # numbered by the server
        sampler_id = clones[0]._sampling_session_id
        for holder in {id(clone.holder): clone.holder for clone in clones}.values():
            holder.close()  # an unpickled client's holder heartbeats the session until closed, as in a worker
    other = httpx.post(f"{server.url}/api/v1/join_sampling_session", json={"sampling_session_id": sampler_id},
                       headers={"X-API-Key": "tml-someone-else"})
    assert other.status_code == 404


def test_an_abandoned_sample_is_cancelled_on_the_server(server: TxServer) -> None:
    with server.client() as service:
        assert service.holder._client_dynamic_config.sample_cancel_enabled
        sampler = service.create_sampling_client(base_model="tiny-qwen3").result()
        sampler.sample(PROMPT, 1, types.SamplingParams(max_tokens=1)).result()  # the engine is up
        before, engine = requests_to(server, "/api/v1/cancel_future"), engine_health(server, "tiny-qwen3")
        # long enough to be still running when given up on: a warm engine answers 8 x 200 tokens in under a second
        future = sampler.sample(PROMPT, 8, types.SamplingParams(max_tokens=2000, stop=[]))
        wait_until(lambda: engine_health(server, "tiny-qwen3")["stats"]["num_generated_tokens"]
                   > engine["stats"]["num_generated_tokens"], "the engine generates the sample")
        assert future.future().cancel(), "still running"  # the SDK's way to give up on an APIFuture
        deadline = time.monotonic() + 30
        while requests_to(server, "/api/v1/cancel_future") == before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert requests_to(server, "/api/v1/cancel_future") == before + 1
        with pytest.raises(Exception):  # noqa: B017 - cancelled, in whichever form the SDK's future reports it
            future.result(timeout=5)
        generated = assert_cancelled(server, "tiny-qwen3", engine)  # the engine dropped its rows
        assert 0 < generated < 8 * 2000
