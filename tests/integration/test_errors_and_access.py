"""Bad input gets a clear error (never a 500 or a hang); keys see only their own runs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tinker
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.request_conv import forward_backward_request_to_proto

from txserver import API_KEY, TxServer

BASE = "tiny-qwen3"
HEADERS = {"X-API-Key": API_KEY}


def datum(tokens: list[int], **inputs) -> types.Datum:
    inputs = inputs or {"target_tokens": tokens[1:] + [0], "weights": [1.0] * len(tokens)}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


@pytest.fixture(scope="module")
def tc(server: TxServer) -> Iterator[tinker.TrainingClient]:
    with server.client() as client:
        yield client.create_lora_training_client(BASE, rank=4).result()


def test_unknown_base_model_is_a_clear_4xx(service_client: tinker.ServiceClient) -> None:
    with pytest.raises(tinker.BadRequestError, match="not served here"):
        service_client.create_lora_training_client("no/such-model", rank=4).result()


def refusal_of(future) -> str:
    """The 400 a batch that can never run gets when it is submitted (it never becomes a failed future)."""
    with pytest.raises(tinker.BadRequestError) as info:
        future.result(timeout=60)
    return str(info.value)


def test_unknown_loss(tc: tinker.TrainingClient) -> None:
    message = refusal_of(tc.forward_backward([datum([1, 2, 3])], "no_such_loss"))
    assert "no_such_loss" in message and "cross_entropy" in message


def test_unknown_loss_config_key(tc: tinker.TrainingClient) -> None:
    message = refusal_of(tc.forward_backward([datum([1, 2, 3])], "cross_entropy", {"beta": 0.1}))
    assert "beta" in message


def test_missing_loss_input(tc: tinker.TrainingClient) -> None:
    bad = datum([1, 2, 3], target_tokens=[2, 3, 4], advantages=[1.0, 1.0, 1.0])
    assert "datum 0" in (message := refusal_of(tc.forward_backward([bad], "importance_sampling")))
    assert "logprobs" in message


def test_misshapen_loss_input(tc: tinker.TrainingClient) -> None:
    bad = datum([1, 2, 3], target_tokens=[2, 3], weights=[1.0, 1.0])
    message = refusal_of(tc.forward_backward([datum([1, 2]), bad], "cross_entropy"))
    assert "datum 1" in message and "target_tokens" in message


def test_tokens_outside_the_vocabulary(tc: tinker.TrainingClient) -> None:
    message = refusal_of(tc.forward_backward([datum([1, 2, 999_999])], "cross_entropy"))
    assert "datum 0" in message and "999999" in message


def test_sequence_longer_than_the_model_allows(tc: tinker.TrainingClient) -> None:
    too_long = list(np.arange(3000) % 1000)
    message = refusal_of(tc.forward([datum(too_long)], "cross_entropy"))
    assert "datum 0" in message and "3000 tokens" in message and "2048" in message


def test_bad_and_missing_api_keys(server: TxServer) -> None:
    r = httpx.post(f"{server.url}/api/v1/client/config", json={"sdk_version": "0.38.0"})
    assert r.status_code == 401 and r.json()["detail"]
    r = httpx.post(f"{server.url}/api/v1/client/config", json={}, headers={"X-API-Key": "sk-nope"})
    assert r.status_code == 401 and "tml-" in r.json()["detail"]


def test_body_that_is_not_protobuf(server: TxServer, tc: tinker.TrainingClient) -> None:
    r = httpx.post(
        f"{server.url}/api/v1/forward_backward",
        content=b"\xff\xfe definitely not protobuf",
        headers={**HEADERS, "Content-Type": "application/x-protobuf"},
    )
    assert r.status_code == 400 and "protobuf" in r.json()["detail"]
    r = httpx.post(f"{server.url}/api/v1/forward_backward", json={"model_id": tc.model_id}, headers=HEADERS)
    assert r.status_code == 400 and "protobuf" in r.json()["detail"]


def test_malformed_json_is_422_with_body(server: TxServer) -> None:
    r = httpx.post(f"{server.url}/api/v1/optim_step", json={"seq_id": "x"}, headers=HEADERS)
    assert r.status_code == 422 and r.json()["detail"]


def test_unknown_future_is_404(server: TxServer) -> None:
    r = httpx.post(f"{server.url}/api/v1/retrieve_future", json={"request_id": "nope"}, headers=HEADERS)
    assert r.status_code == 404 and "nope" in r.json()["detail"]


def test_another_key_cannot_see_or_touch_a_run(server: TxServer, tc: tinker.TrainingClient) -> None:
    path = tc.save_state("private").result().path
    with server.client("tml-someone-else") as other:
        rest = other.create_rest_client()
        with pytest.raises(tinker.NotFoundError):
            rest.get_training_run(tc.model_id).result()
        with pytest.raises(tinker.NotFoundError):
            rest.list_checkpoints(tc.model_id).result()
        with pytest.raises(tinker.NotFoundError):
            rest.get_weights_info_by_tinker_path(path).result()
        with pytest.raises(tinker.NotFoundError):
            other.create_training_client_from_state(path).result()
        assert tc.model_id not in [r.training_run_id for r in rest.list_training_runs().result().training_runs]


def _fwd_body(model_id: str, seq_id: int) -> bytes:
    request = types.ForwardBackwardRequest(
        model_id=model_id,
        seq_id=seq_id,
        forward_backward_input=types.ForwardBackwardInput(
            data=[datum([5, 6, 7, 8])], loss_fn="cross_entropy"
        ),
    )
    return forward_backward_request_to_proto(request).SerializeToString()


def _submit(server: TxServer, model_id: str, seq_id: int) -> str:
    r = httpx.post(
        f"{server.url}/api/v1/forward_backward",
        content=_fwd_body(model_id, seq_id),
        headers={**HEADERS, "Content-Type": "application/x-protobuf"},
    )
    assert r.status_code == 200, r.text
    return r.json()["request_id"]


def _result(server: TxServer, request_id: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/api/v1/retrieve_future",
        json={"request_id": request_id, "allow_metadata_only": False},
        headers={**HEADERS, "Accept": "application/x-protobuf"},
        timeout=45,
    )


@pytest.fixture
def new_model(server: TxServer) -> Iterator[str]:
    """A fresh model's id; its client is closed after the test (its session, and the model, end with it)."""
    with server.client() as client:
        yield client.create_lora_training_client(BASE, rank=4).result().model_id


def test_repeated_seq_id_returns_the_original_future(server: TxServer, new_model: str) -> None:
    model_id = new_model
    first = _submit(server, model_id, 1)
    assert _submit(server, model_id, 1) == first
    response = _result(server, first)
    assert response.headers["content-type"].startswith("application/x-protobuf")
    output = pb.ForwardBackwardOutput.FromString(response.content)
    assert "loss:sum" in output.metrics


def test_a_gap_in_seq_ids_is_skipped_after_the_timeout(server: TxServer, new_model: str) -> None:
    """The test server waits 3 s for a missing seq_id, then runs the next one; a late arrival fails."""
    model_id = new_model
    started = time.monotonic()
    later = _submit(server, model_id, 2)  # seq 1 never arrives
    response = _result(server, later)
    assert response.headers["content-type"].startswith("application/x-protobuf"), response.text
    assert time.monotonic() - started >= 2.5
    late = _result(server, _submit(server, model_id, 1)).json()
    assert late["category"] == "user" and "skipped" in late["error"]
    assert _result(server, _submit(server, model_id, 3)).headers["content-type"].startswith(
        "application/x-protobuf"
    )


REFUSED_CALLS = {
    "negative learning rate": lambda tc: tc.optim_step(types.AdamParams(learning_rate=-1e-3)),
    "NaN learning rate": lambda tc: tc.optim_step(types.AdamParams(learning_rate=float("nan"))),
    "infinite learning rate": lambda tc: tc.optim_step(types.AdamParams(learning_rate=float("inf"))),
    "over the context": lambda tc: tc.forward_backward([datum([1] * 2049)], "cross_entropy"),
    "outside the vocabulary": lambda tc: tc.forward_backward([datum([1, 2, 999_999])], "cross_entropy"),
    "external save to a bad age recipient": lambda tc: tc.save_weights_external(
        "sealed", age_encryption_recipients=["age1notakey"]),
    "external save under a bad name": lambda tc: tc.save_weights_external("../up"),
}


@pytest.mark.parametrize("refused", sorted(REFUSED_CALLS))
def test_a_call_refused_at_submission_does_not_stall_the_next(server: TxServer, refused: str) -> None:
    """The refused call (a 4xx, not a failed future) used up a seq_id; the next call runs at once: the queue
    never waits out the (3 s) gap timeout for it, which the server would log as a skipped seq_id."""
    with server.client() as client:
        tc = client.create_lora_training_client(BASE, rank=4).result()
        with pytest.raises((tinker.BadRequestError, tinker.UnprocessableEntityError)):
            REFUSED_CALLS[refused](tc).result(timeout=30)
        tc.forward_backward([datum([1, 2, 3])], "cross_entropy").result(timeout=60)
        assert f"model {tc.model_id}: seq_id" not in server.log()
