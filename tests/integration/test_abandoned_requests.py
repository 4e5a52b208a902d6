"""A client that goes away stops the work: an OpenAI-compatible request (streamed or not) whose HTTP client
disconnects is aborted on the embedded engine, which counts it (`num_cancelled`), drops its rows and generates
far fewer than the 2,000 tokens asked for. The SDK's cancelled sample: test_client_features; vLLM:
tests/vllm_engine/test_serve_vllm.py."""

from __future__ import annotations

import json

import httpx
from abandon import assert_cancelled, engine_health, post_and_hang_up
from txserver import API_KEY, TxServer

BASE = "tiny-qwen3"
LONG = {"model": BASE, "prompt": "The capital of France is", "max_tokens": 2000, "temperature": 0.0}
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def warm(server: TxServer) -> None:
    httpx.post(f"{server.url}/oai/api/v1/completions", json={**LONG, "max_tokens": 1}, headers=AUTH,
               timeout=300).raise_for_status()


def test_a_stream_closed_after_its_first_chunk_is_aborted_on_the_engine(server: TxServer) -> None:
    warm(server)
    before = engine_health(server, BASE)
    with httpx.Client(timeout=300) as client, client.stream(
            "POST", f"{server.url}/oai/api/v1/completions", json={**LONG, "stream": True}, headers=AUTH) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                break  # the first text: the client goes away
    generated = assert_cancelled(server, BASE, before)
    assert 0 < generated < 2000, f"{generated} tokens generated for an abandoned 2,000-token request"


def test_a_request_whose_client_disconnects_is_aborted_on_the_engine(server: TxServer) -> None:
    warm(server)
    before = engine_health(server, BASE)
    generating = before["stats"]["num_generated_tokens"]
    post_and_hang_up(server, "/oai/api/v1/completions", LONG,
                     until=lambda: engine_health(server, BASE)["stats"]["num_generated_tokens"] > generating)
    generated = assert_cancelled(server, BASE, before)
    assert 0 < generated < 2000, f"{generated} tokens generated for an abandoned 2,000-token request"
