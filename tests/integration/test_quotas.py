"""Quotas per key (tx/core/quotas.py) on a live server with small limits, through the SDK and raw HTTP: past each,
a clear 403 (or a 429 for queued work) naming the quota and the setting that raises it, and the operator's view
of every key's use (the shared-server probe's finding 4: unbounded sessions, runs, queued bodies, custom losses,
checkpoints, image pointers fetched before the model was checked, num_samples past the engine's batch)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tinker
from prometheus_client.parser import text_string_to_metric_families
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from txserver import TxServer

KEY, OTHER = "tml-quota-a", "tml-quota-b"
QUOTAS = {
    "TX_QUOTA_SESSIONS": "3", "TX_QUOTA_RUNS": "2", "TX_QUOTA_LORA_RANK": "12", "TX_QUOTA_CUSTOM_LOSSES": "1",
    "TX_QUOTA_IMAGES_PER_REQUEST": "1", "TX_QUOTA_SAMPLES_IN_FLIGHT": "4", "TX_QUOTA_CHECKPOINT_BYTES": "1",
    "TX_QUOTA_QUEUED_TRAINING_BYTES": "30000",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    with TxServer(tmp_path_factory.mktemp("tx-quotas"), env=QUOTAS) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: TxServer) -> Iterator[tinker.ServiceClient]:
    with server.client(KEY) as c:
        yield c


def refused(error: pytest.ExceptionInfo, quota: str, status: int) -> None:
    exc = error.value
    assert isinstance(exc, tinker.APIStatusError) and exc.status_code == status, exc
    assert f"quota {quota!r}" in str(exc) and f"TX_QUOTA_{quota.upper()}" in str(exc), exc


def post(server: TxServer, route: str, body: dict, key: str = KEY) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1/{route}", json=body, headers={"X-API-Key": key}, timeout=60)


@pytest.fixture(scope="module")
def trainers(client: tinker.ServiceClient) -> list[tinker.TrainingClient]:
    first = client.create_lora_training_client("tiny-qwen3", rank=8).result()
    with pytest.raises(tinker.APIStatusError) as error:  # 8 + 8 is over 12
        client.create_lora_training_client("tiny-qwen3", rank=8).result()
    refused(error, "lora_rank", 403)
    return [first, client.create_lora_training_client("tiny-qwen3", rank=4).result()]


def test_runs_and_lora_rank(client: tinker.ServiceClient, trainers: list[tinker.TrainingClient]) -> None:
    with pytest.raises(tinker.APIStatusError) as error:
        client.create_lora_training_client("tiny-qwen3", rank=1).result()
    refused(error, "runs", 403)


def test_sessions(server: TxServer, client: tinker.ServiceClient) -> None:
    session = {"tags": [], "user_metadata": {}, "sdk_version": "0.38.0", "type": "create_session"}
    opened = [post(server, "create_session", session) for _ in range(3)]
    assert [r.status_code for r in opened[:2]] == [200, 200] and opened[2].status_code == 403, opened[2].text
    assert "quota 'sessions'" in opened[2].json()["detail"]
    assert post(server, "create_session", session, key=OTHER).status_code == 200  # another key's own quota
    for reply in opened[:2]:  # finished, they free the quota
        finish = {"reason": {"type": "success"}}
        assert post(server, f"sessions/{reply.json()['session_id']}/finish", finish).status_code == 200
    assert post(server, "create_session", session).status_code == 200


def forward_backward(server: TxServer, model_id: str, seq_id: int, tokens: list[int]) -> httpx.Response:
    """One forward_backward as the SDK sends it (protobuf), at the `seq_id` asked."""
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens),
                        loss_fn_inputs={"target_tokens": [t + 1 for t in tokens], "weights": [1.0] * len(tokens)})
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy"),
        model_id=model_id, seq_id=seq_id)
    return httpx.post(f"{server.url}/api/v1/forward_backward", timeout=60,
                      content=forward_backward_request_to_proto(request).SerializeToString(),
                      headers={"X-API-Key": KEY, "Content-Type": "application/x-protobuf"})


def outcome(server: TxServer, submitted: httpx.Response) -> httpx.Response:
    """The future's final answer (retrieve_future until it is not try_again)."""
    request_id = submitted.json()["request_id"]
    while True:
        reply = post(server, "retrieve_future", {"request_id": request_id})
        waiting = reply.headers["content-type"].startswith("application/json") and reply.json().get("type") == "try_again"
        if not waiting:
            return reply


def test_queued_training_bytes(server: TxServer, trainers: list[tinker.TrainingClient]) -> None:
    """Calls with future seq_ids wait in the queue holding their bodies: a key's bytes there are bounded (429). The
    call refused, resent as the SDK resends a 429, runs once the queue moved on: its seq_id was not used up."""
    model_id, tokens = trainers[0].model_id, list(range(1, 601))  # seq_id 1 not sent yet: 2 and 3 wait for it
    replies = [forward_backward(server, model_id, seq_id, tokens) for seq_id in (2, 3, 4)]
    assert [r.status_code for r in replies[:2]] == [200, 200], replies[0].text
    assert replies[2].status_code == 429 and "quota 'queued_training_bytes'" in replies[2].text
    report = httpx.get(f"{server.url}/api/v1/tx/usage", headers={"X-API-Key": KEY}, timeout=60).json()
    mine = next(k for k in report["keys"] if k["runs"] == 2)
    assert mine["queued_training_calls"] == 2 and mine["queued_training_bytes"] > 10000
    first = forward_backward(server, model_id, 1, [1, 2, 3])  # the gap: 1, 2 and 3 run, freeing the bytes
    assert first.status_code == 200
    assert outcome(server, replies[1]).headers["content-type"] == "application/x-protobuf"
    resent = forward_backward(server, model_id, 4, tokens)
    assert resent.status_code == 200, resent.text
    done = outcome(server, resent)
    assert done.headers["content-type"] == "application/x-protobuf", done.text  # ran (not "its turn was skipped")


def test_samples_images_and_num_samples(server: TxServer, client: tinker.ServiceClient) -> None:
    sampler = client.create_sampling_client(base_model="tiny-qwen3").result()
    params = types.SamplingParams(max_tokens=2)
    prompt = types.ModelInput.from_ints([1, 2, 3])
    with pytest.raises(tinker.APIStatusError) as error:  # 5 sequences alone are over 4: no retry can succeed
        sampler.sample(prompt, 5, params).result()
    refused(error, "samples_in_flight", 403)
    assert len(sampler.sample(prompt, 4, params).result().sequences) == 4
    pointer = {"type": "image_asset_pointer", "format": "png", "location": "http://169.254.169.254/x.png"}
    body = {"sampling_session_id": sampler._sampling_session_id, "seq_id": 99, "num_samples": 1,
            "sampling_params": {"max_tokens": 2}, "type": "sample",
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}, pointer, pointer]}}
    reply = post(server, "asample", body)
    assert reply.status_code == 403 and "quota 'images_per_request'" in reply.json()["detail"]
    reply = post(server, "asample", {**body, "seq_id": 100, "prompt": {"chunks": [pointer]}})
    assert reply.status_code == 400 and "takes text only" in reply.json()["detail"]  # before any fetch
    reply = post(server, "asample", {**body, "seq_id": 101, "num_samples": 33,
                                     "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]}})
    assert reply.status_code == 400 and "over the engines' batch of 32" in reply.json()["detail"]


def loss(logprobs):
    return -logprobs.sum(), {}


def other_loss(logprobs):
    return -logprobs.mean(), {}


def test_custom_losses_and_checkpoint_bytes(server: TxServer, client: tinker.ServiceClient,
                                            trainers: list[tinker.TrainingClient]) -> None:
    client.create_custom_loss(loss, input_ranks={"logprobs": 1}).result()
    with pytest.raises(tinker.APIStatusError) as error:
        client.create_custom_loss(other_loss, input_ranks={"logprobs": 1}).result()
    refused(error, "custom_losses", 403)
    training = trainers[1]
    first = training.save_weights_for_sampler("first").result().path  # under the 1-byte quota when asked
    with pytest.raises(tinker.APIStatusError) as error:
        training.save_state("second").result()
    refused(error, "checkpoint_bytes", 403)
    with pytest.raises(tinker.APIStatusError) as error:  # a copy counts too (it could outlive its source)
        tinker.RestClient(base_url=server.url, api_key=KEY).copy_weights(first, "elsewhere").result()
    refused(error, "checkpoint_bytes", 403)


def test_operators_see_every_keys_use(server: TxServer, trainers: list[tinker.TrainingClient]) -> None:
    report = httpx.get(f"{server.url}/api/v1/tx/usage", headers={"X-API-Key": KEY}, timeout=60).json()
    assert report["limits"]["runs"] == 2 and report["settings"]["runs"] == "--quota-runs / TX_QUOTA_RUNS"
    busiest = report["keys"][0]
    assert busiest["runs"] == 2 and busiest["lora_rank"] == 12 and busiest["custom_losses"] == 1
    assert busiest["sessions"] >= 1 and busiest["checkpoint_bytes"] > 1 and busiest["sampled_tokens"] > 0
    assert busiest["trained_tokens"] > 0
    text = httpx.get(f"{server.url}/metrics", timeout=60).text
    usage = {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
             for s in f.samples if s.name == "tx_tenant_usage"}
    assert usage[(("owner", busiest["owner"]), ("quota", "runs"))] == 2
    assert np.isfinite(list(usage.values())).all()
