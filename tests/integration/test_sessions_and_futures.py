"""Sessions (rows 36-40: list, get, project, trace export, search) and futures (rows 22-23:
retrieve_futures, cancel_future), through the SDK where it has a call, else its wire shapes."""

from __future__ import annotations

import contextlib
import json
import urllib.request

import httpx
import pytest
import tinker
from conftest import Trained
from tinker.types import SessionSearchRequest

from txserver import API_KEY, TxServer

HEADERS = {"X-API-Key": API_KEY}


def post(server: TxServer, route: str, body: dict, key: str = API_KEY) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1/{route}", json=body, headers={"X-API-Key": key}, timeout=60)


def session_of(model_id: str) -> str:
    return model_id.split(":")[0]


def test_sessions_list_get_and_project(server: TxServer, trained: Trained) -> None:
    session = session_of(trained.tc.model_id)
    trained.tc.save_weights_and_get_sampling_client().result()
    assert session in trained.rest.list_sessions(limit=1000).result().sessions
    found = trained.rest.get_session(session).result()
    assert trained.tc.model_id in found.training_run_ids and found.sampler_ids
    trained.rest.assign_session_project(session, "proj-a").result()
    other = tinker.RestClient(base_url=server.url, api_key="tml-someone-else")
    with pytest.raises(tinker.NotFoundError):
        other.get_session(session).result()
    with pytest.raises(tinker.NotFoundError):
        other.assign_session_project(session, "mine").result()
    assert session not in other.list_sessions().result().sessions


@pytest.mark.filterwarnings("ignore:RestClient.search_sessions is experimental")
def test_session_search(server: TxServer) -> None:
    key = "tml-searcher"
    with contextlib.ExitStack() as stack:
        services = [stack.enter_context(server.client(key, display_name=f"nightly run {i}",
                                                      user_metadata={"team": "a" if i else "b"}))
                    for i in range(3)]
        samplers = [s.create_sampling_client(base_model="tiny-qwen3").result() for s in services]
        ids = [session_of(sampler._sampling_session_id) for sampler in samplers]
        rest = tinker.RestClient(base_url=server.url, api_key=key)
        page = rest.search_sessions(SessionSearchRequest(display_name="NIGHTLY run", limit=2)).result()
        assert len(page.sessions) == 2 and page.next_cursor is not None
        rest_page = rest.search_sessions(SessionSearchRequest(display_name="nightly", cursor=page.next_cursor)).result()
        assert len(rest_page.sessions) == 1
        assert {s.session_id for s in page.sessions + rest_page.sessions} == set(ids)
        team_a = rest.search_sessions(SessionSearchRequest(user_metadata={"team": "a"})).result()
        assert len(team_a.sessions) == 2 and all(s.status.type == "active" for s in team_a.sessions)
        services[0].close("success").result()
        finished = rest.search_sessions(SessionSearchRequest.model_validate(
            {"statuses": [{"type": "client_finished", "reasons": ["success"]}]})).result()
        assert [s.display_name for s in finished.sessions] == ["nightly run 0"]


def test_trace_export_is_a_chrome_trace_of_the_session(trained: Trained) -> None:
    session = session_of(trained.tc.model_id)
    url = trained.rest.export_session_trace(session).result()
    with urllib.request.urlopen(url, timeout=30) as response:  # a signed URL: no API key
        trace = json.load(response)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    runs = {e["name"] for e in slices if e["cat"] == "run"}
    assert {"CreateModel", "ForwardBackward", "OptimStep", "SaveWeights"} <= runs
    assert all(e["dur"] >= 0 and e["ts"] > 1.6e15 for e in slices)  # microseconds since the epoch
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert trained.tc.model_id in tracks


def test_retrieve_futures_reports_each_clones_completions(server: TxServer) -> None:
    with server.client() as service:
        sampler = service.create_sampling_client(base_model="tiny-qwen3").result()._sampling_session_id
        sample = {"sampling_session_id": sampler, "num_samples": 1, "prompt_logprobs": False,
                  "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                  "sampling_params": {"max_tokens": 2, "temperature": 0.0, "top_k": -1, "top_p": 1.0}}
        original = [post(server, "asample", {**sample, "seq_id": i}).json()["request_id"] for i in range(2)]
        clone = post(server, "asample", {**sample, "seq_id": 10**9 + 5}).json()["request_id"]
        target = {"type": "sampling_session", "sampling_session_id": sampler, "cloned_sampler_id": 0}
        seen, cursor = [], 0
        while len(seen) < 2:
            reply = post(server, "retrieve_futures", {"target": target, "prev_cursor": cursor}).json()
            seen += [c["request_id"] for c in reply["completions"] if c["state"] == "finished"]
            cursor = reply["cursor"]
        assert sorted(seen) == sorted(original)
        for request_id in original:  # the payloads still come from retrieve_future
            r = post(server, "retrieve_future", {"request_id": request_id})
            assert "protobuf" in r.headers["content-type"]
        ack = post(server, "retrieve_futures", {"target": target, "prev_cursor": cursor, "timeout": 0,
                                                "retrieved_request_ids": original}).json()
        assert ack == {"completions": [], "cursor": cursor}
        assert post(server, "retrieve_future", {"request_id": original[0]}).status_code == 404  # acked: freed
        clone_reply = post(server, "retrieve_futures", {"target": {**target, "cloned_sampler_id": 1}}).json()
        assert [c["request_id"] for c in clone_reply["completions"]] == [clone]
        stranger = post(server, "retrieve_futures", {"target": target}, key="tml-someone-else")
        assert stranger.status_code == 404


def test_cancel_future_fails_a_queued_operation(server: TxServer) -> None:
    with server.client() as service:
        tc = service.create_lora_training_client("tiny-qwen3", rank=4).result()
        queued = post(server, "optim_step", {"model_id": tc.model_id, "seq_id": 2, "type": "optim_step",
                                             "adam_params": {"learning_rate": 1e-4}}).json()["request_id"]
        assert post(server, "cancel_future", {"request_id": queued}).status_code == 200
        result = post(server, "retrieve_future", {"request_id": queued}).json()
        assert result["category"] == "user" and "cancelled" in result["error"]
        assert post(server, "cancel_future", {"request_id": "no-such"}).status_code == 404
        assert post(server, "cancel_future", {"request_id": queued}, key="tml-someone-else").status_code == 404
