"""Server-side custom losses (create_custom_loss): same training as the SDK's client-side path, one
round trip, and graphs outside the allowlist refused with a 400 that names the node."""

from __future__ import annotations

import dataclasses

import httpx
import numpy as np
import pytest
import tinker
import torch
from tinker import types
from txserver import API_KEY, TxServer

BASE = "tiny-qwen3"


def margin_loss(logprobs, weights, advantages):
    """Not a built-in loss: a logistic margin on weighted logprobs plus a probability penalty."""
    margin = torch.nn.functional.logsigmoid(2.0 * logprobs * advantages)
    loss = -(margin * weights).sum() + 0.1 * torch.exp(logprobs).mean()
    return loss, {"custom/margin:sum": -margin.sum(), "custom/tokens:mean": weights.sum()}


def data(seed: int) -> list[types.Datum]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(3):
        tokens = rng.integers(10, 1990, size=14).tolist()
        out.append(types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={
                "target_tokens": tokens[1:],
                "weights": rng.uniform(0, 1, size=13).astype(np.float32),
                "advantages": rng.normal(size=13).astype(np.float32),
            },
        ))
    return out


def test_server_side_custom_loss_trains_like_the_client_side_path(service_client: tinker.ServiceClient) -> None:
    handle = service_client.create_custom_loss(
        margin_loss, input_ranks={"logprobs": 1, "weights": 1, "advantages": 1}
    ).result()
    assert handle.loss_id is not None  # client/config says custom_loss_server_side: the loss was uploaded
    local = dataclasses.replace(handle, loss_id=None)  # the same traced graph, run by the SDK itself
    server = service_client.create_lora_training_client(BASE, rank=4, seed=3).result()
    client = service_client.create_lora_training_client(BASE, rank=4, seed=3).result()
    adam = types.AdamParams(learning_rate=1e-2)
    for step in range(3):
        batch = data(step)
        a = server.forward_backward_custom(batch, handle).result()
        b = client.forward_backward_custom(batch, local).result()
        assert "surrogate_loss:sum" not in a.metrics  # one forward_backward, no forward + surrogate
        for key in ("loss:sum", "custom/margin:sum", "custom/tokens:mean"):
            assert a.metrics[key] == pytest.approx(b.metrics[key], rel=1e-6, abs=1e-6), key
        for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs):
            np.testing.assert_allclose(x["logprobs"].to_numpy(), y["logprobs"].to_numpy(), atol=1e-6)
        server.optim_step(adam).result()
        client.optim_step(adam).result()
    probe = data(9)
    after_a = server.forward(probe, "cross_entropy").result().loss_fn_outputs
    after_b = client.forward(probe, "cross_entropy").result().loss_fn_outputs
    for x, y in zip(after_a, after_b):
        np.testing.assert_allclose(x["logprobs"].to_numpy(), y["logprobs"].to_numpy(), atol=1e-5)


def _nested(depth: int) -> object:
    value: object = {"ref": "logprobs"}
    for _ in range(depth):
        value = [value]
    return value


def _graph(*nodes: dict) -> list[dict]:
    head = [{"op": "placeholder", "name": "logprobs", "target": "logprobs"}]
    tail = [{"op": "output", "name": "output", "target": "output",
             "args": [{"tuple": [{"ref": "logprobs"}, {"dict": {}}]}]}]
    return head + list(nodes) + tail


@pytest.mark.parametrize(
    ("nodes", "named"),
    [
        (_graph({"op": "call_function", "name": "boom", "target": "os.system", "args": ["touch /tmp/x"]}),
         "'os.system'"),
        (_graph({"op": "call_function", "name": "ev", "target": "builtins.eval", "args": ["1+1"]}),
         "'builtins.eval'"),
        (_graph({"op": "call_function", "name": "cls", "target": "getattr", "args": [{"ref": "logprobs"}, "__class__"]},
                {"op": "call_function", "name": "init", "target": "getattr", "args": [{"ref": "cls"}, "__init__"]},
                {"op": "call_function", "name": "glob", "target": "getattr", "args": [{"ref": "init"}, "__globals__"]}),
         "'__class__'"),
        (_graph({"op": "call_function", "name": "glob", "target": "getattr", "args": [{"ref": "logprobs"}, "__globals__"]}),
         "'__globals__'"),
        (_graph({"op": "call_method", "name": "ga", "target": "__getattribute__", "args": [{"ref": "logprobs"}, "x"]}),
         "'__getattribute__'"),
        (_graph({"op": "get_attr", "name": "w", "target": "weight"}), "get_attr"),
        (_graph({"op": "call_function", "name": "e", "target": "torch.exp", "args": [{"ref": "nowhere"}]}),
         "'nowhere'"),
        # the shared-server probe: pure-Python arithmetic on request values froze the server; deep nesting was a 500
        (_graph({"op": "call_function", "name": "big", "target": "operator.pow", "args": [3, 20000000]}),
         "node 'big' computes operator.pow on the request's constants only"),
        (_graph({"op": "call_function", "name": "deep", "target": "torch.stack", "args": [_nested(600)]}),
         "node 'deep' has arguments nested over 16 deep"),
    ],
)
def test_graphs_outside_the_allowlist_are_refused(server: TxServer, service_client: tinker.ServiceClient,
                                                  nodes: list[dict], named: str) -> None:
    body = {
        "session_id": service_client.holder.get_session_id(), "custom_loss_seq_id": 100, "name": "evil",
        "inputs": [{"name": "logprobs", "rank": 1}], "graph": {"format": 1, "nodes": nodes},
        "type": "create_custom_loss",
    }
    reply = httpx.post(f"{server.url}/api/v1/create_custom_loss", json=body, headers={"X-API-Key": API_KEY})
    assert reply.status_code == 400, reply.text
    assert named in reply.json()["detail"]


def test_unknown_loss_id_is_refused(service_client: tinker.ServiceClient) -> None:
    tc = service_client.create_lora_training_client(BASE, rank=4, seed=0).result()
    with pytest.raises(Exception, match="unknown loss_id"):
        tc.forward_backward(data(0), "custom", {"loss_id": "nope"}).result()


def test_inputs_the_loss_does_not_get_are_refused_at_submission(service_client: tinker.ServiceClient) -> None:
    handle = service_client.create_custom_loss(
        margin_loss, input_ranks={"logprobs": 1, "weights": 1, "advantages": 1}
    ).result()
    tc = service_client.create_lora_training_client(BASE, rank=4, seed=0).result()
    batch = data(0)
    del batch[1].loss_fn_inputs["advantages"]
    with pytest.raises(tinker.BadRequestError, match="datum 1: loss_fn_inputs lacks 'advantages'"):
        tc.forward_backward(batch, "custom", {"loss_id": handle.loss_id}).result()
