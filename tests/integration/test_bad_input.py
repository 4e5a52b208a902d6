"""Bad input on the JSON routes: a clear 4xx with a JSON body, never a 500 (found by a live probe)."""

from __future__ import annotations

import json

import httpx
import pytest

from txserver import API_KEY, TxServer

HEADERS = {"X-API-Key": API_KEY, "Content-Type": "application/json"}
LONE = "\\ud800"  # a JSON escape of a lone UTF-16 surrogate: valid JSON, not encodable text
PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]}
PARAMS = {"max_tokens": 2}

# route -> a body whose id field holds the lone surrogate
SURROGATE_BODIES = {
    "session_heartbeat": {"session_id": LONE},
    "get_info": {"model_id": LONE},
    "weights_info": {"tinker_path": f"tinker://{LONE}/weights/x"},
    "create_session": {"tags": [LONE], "sdk_version": "0.38.0"},
    "create_model": {"session_id": LONE, "model_seq_id": 0, "base_model": "tiny-qwen3"},
    "create_sampling_session": {"session_id": LONE, "sampling_session_seq_id": 0, "base_model": "tiny-qwen3"},
    "optim_step": {"model_id": LONE, "seq_id": 1, "adam_params": {"learning_rate": 1e-4}},
    "save_weights": {"model_id": LONE, "seq_id": 1, "path": "x"},
    "asample": {"sampling_session_id": LONE, "seq_id": 1, "prompt": PROMPT, "sampling_params": PARAMS},
}


def post_raw(server: TxServer, route: str, text: str | bytes) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1/{route}", content=text, headers=HEADERS, timeout=30)


def _json_text(body: dict) -> str:
    """JSON text with the placeholder turned into the escape itself (json.dumps would double the backslash)."""
    return json.dumps(body).replace("\\\\ud800", "\\ud800")


@pytest.mark.parametrize("route", sorted(SURROGATE_BODIES))
def test_a_lone_surrogate_in_an_id_is_a_4xx(server: TxServer, route: str) -> None:
    r = post_raw(server, route, _json_text(SURROGATE_BODIES[route]))
    assert r.status_code == 422 and r.json()["detail"], r.text


def test_a_lone_surrogate_in_metadata_is_refused_and_listing_runs_stays_up(server: TxServer) -> None:
    r = post_raw(server, "create_session", _json_text({"tags": [], "user_metadata": {"k": LONE}}))
    assert r.status_code == 422, r.text
    r = post_raw(server, "create_session", _json_text({"tags": [], "user_metadata": {LONE: "v"}}))
    assert r.status_code == 422, r.text
    r = httpx.get(f"{server.url}/api/v1/training_runs", headers=HEADERS)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("query", [
    "offset=9223372036854775808", "offset=-1", "limit=-1", "limit=0", "limit=1000000",
])
@pytest.mark.parametrize("route", ["sessions", "training_runs"])
def test_listing_bounds_are_422s(server: TxServer, route: str, query: str) -> None:
    r = httpx.get(f"{server.url}/api/v1/{route}?{query}", headers=HEADERS)
    assert r.status_code == 422 and r.json()["detail"], r.text


def test_a_large_json_body_is_a_413(server: TxServer) -> None:
    big = json.dumps({"tags": [], "user_metadata": {"blob": "x" * (5 << 20)}})
    r = post_raw(server, "create_session", big)
    assert r.status_code == 413 and "limit" in r.json()["detail"], r.text


def test_a_large_streamed_json_body_is_a_413(server: TxServer) -> None:
    """No Content-Length (chunked): the body is counted as it arrives."""
    def chunks():
        yield b'{"tags": [], "user_metadata": {"blob": "'
        for _ in range(80):
            yield b"x" * (64 << 10)
        yield b'"}}'

    r = httpx.post(f"{server.url}/api/v1/create_session", content=chunks(), headers=HEADERS, timeout=30)
    assert r.status_code == 413 and "limit" in r.json()["detail"], r.text


@pytest.mark.parametrize("body", [
    {"tags": [], "user_metadata": {"blob": "x" * (100 << 10)}},
    {"tags": ["t"] * 1000},
    {"tags": ["x" * 5000]},
])
def test_oversized_metadata_is_a_422(server: TxServer, body: dict) -> None:
    r = post_raw(server, "create_session", json.dumps(body))
    assert r.status_code == 422 and r.json()["detail"], r.text
