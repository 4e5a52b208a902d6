"""Sampling at its limits: a full queue answers 429 and the SDK's retry succeeds; user mistakes are 400s."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import tinker
from sampling_options import sampled_in_full
from tinker import types
from txserver import API_KEY, TxServer

BASE = "tiny-qwen3"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """At most one sample in flight: a second one at the same moment gets a 429."""
    with TxServer(tmp_path_factory.mktemp("tx-limits"),
                  args=["--no-engine-colocate"], env={"TX_SAMPLING_MAX_QUEUE": "1"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def sampler(server: TxServer) -> Iterator[tinker.SamplingClient]:
    with server.client() as client:
        yield client.create_sampling_client(base_model=BASE)


def test_the_sdk_retry_after_a_429_succeeds(sampler: tinker.SamplingClient) -> None:
    params = types.SamplingParams(max_tokens=4, temperature=1.0)
    futures = [sampler.sample(types.ModelInput.from_ints([5, 6, 7]), 1, params) for _ in range(3)]
    for future in futures:  # each one completes: 4 tokens, or fewer ending in a stop token (temperature 1)
        (seq,) = future.result(timeout=120).sequences
        assert sampled_in_full(seq, 4), seq


@pytest.fixture(scope="module")
def sampler_id(server: TxServer) -> str:
    def post(route: str, body: dict) -> dict:
        r = httpx.post(f"{server.url}/api/v1/{route}", headers={"X-API-Key": API_KEY}, json=body, timeout=30)
        r.raise_for_status()
        return r.json()

    session_id = post("create_session", {"tags": [], "sdk_version": "0.38.0"})["session_id"]
    body = {"session_id": session_id, "sampling_session_seq_id": 0, "base_model": BASE}
    return post("create_sampling_session", body)["sampling_session_id"]


def _asample(server: TxServer, sampler_id: str, **overrides) -> httpx.Response:
    body = {
        "sampling_session_id": sampler_id, "seq_id": 1, "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
        "sampling_params": {"max_tokens": 2, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
        **overrides,
    }
    return httpx.post(f"{server.url}/api/v1/asample", headers={"X-API-Key": API_KEY}, json=body, timeout=30)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"prompt": {"chunks": [{"type": "encoded_text", "tokens": []}]}}, "prompt is empty"),
    ({"prompt": {"chunks": []}}, "prompt is empty"),
    ({"num_samples": 1025}, "num_samples"),
    ({"num_samples": 10**7}, "num_samples"),
    ({"topk_prompt_logprobs": 5000, "prompt_logprobs": True}, "topk_prompt_logprobs"),
])
def test_sampling_mistakes_are_400s_at_submission(
    server: TxServer, sampler_id: str, overrides: dict, message: str
) -> None:
    r = _asample(server, sampler_id, **overrides)
    assert r.status_code == 400 and message in r.json()["detail"], r.text


def test_an_empty_prompt_through_the_sdk_is_a_bad_request(sampler: tinker.SamplingClient) -> None:
    with pytest.raises(tinker.BadRequestError, match="prompt is empty"):
        sampler.sample(types.ModelInput.from_ints([]), 1, types.SamplingParams(max_tokens=2)).result(timeout=60)
