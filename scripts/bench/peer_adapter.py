"""The loopback wire adapter scripts/bench/peer.py puts in front of each server it compares.

`--translate` (SkyRL's tx 0.3.0, which predates the protobuf wire of the `tinker` SDK 0.38): answers
`/api/v1/client/config` with `{}` (the SDK's own defaults, as for a server without the route), turns the SDK's
protobuf forward_backward body into the JSON request such a server takes, and turns its JSON forward_backward and
sample results back into the protobuf the SDK asks for (tx's own codec, tx/api/wire/codec.py, both ways), and
gives each sample promise the `sample_sequence_ids` the SDK requires (`<request id>-<i>`, made up here).
Everything else passes through unchanged. Without `--translate` (tx) it only passes through, so both servers
get the same extra loopback hop.

    python scripts/bench/peer_adapter.py --upstream http://127.0.0.1:PORT --port PORT [--translate]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx
import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tx.api.wire import codec
from tx.types import ForwardBackwardResult, SampledSequence, SampleResult, StopReason, TextChunk

DROPPED = {"host", "content-length", "content-encoding", "transfer-encoding", "connection", "accept-encoding"}


def forward_backward_json(body: bytes, content_encoding: str | None) -> tuple[str, dict[str, Any]]:
    """The SDK's protobuf forward_backward body as (route, JSON request) of the pre-protobuf wire."""
    msg = codec.parse_forward_backward_request(body, content_encoding, zstd_enabled=True)
    given = codec.forward_backward_input_from_proto(msg)
    data = []
    for datum in given.data:
        chunks = [{"type": "encoded_text", "tokens": list(c.tokens)} for c in datum.model_input.chunks
                  if isinstance(c, TextChunk)]
        inputs = {name: {"data": a.ravel().tolist(), "dtype": "float32" if a.dtype.kind == "f" else "int64",
                         "shape": list(a.shape)} for name, a in datum.loss_fn_inputs.items()}
        data.append({"model_input": {"chunks": chunks}, "loss_fn_inputs": inputs})
    payload = {"data": data, "loss_fn": given.loss_fn, "loss_fn_config": given.loss_fn_config or None}
    if given.forward_only:
        return "/api/v1/forward", {"model_id": msg.model_id, "seq_id": msg.seq_id, "forward_input": payload}
    return "/api/v1/forward_backward", {"model_id": msg.model_id, "seq_id": msg.seq_id,
                                        "forward_backward_input": payload}


def array(value: Any) -> np.ndarray:
    if not isinstance(value, dict):
        return np.asarray(value, dtype=np.float32)
    dtype = np.int64 if str(value.get("dtype", "float32")).startswith("int") else np.float32
    out = np.asarray(value["data"], dtype=dtype)
    return out.reshape(value["shape"]) if value.get("shape") else out


def result_proto(result: Any) -> bytes | None:
    """A JSON forward_backward or sample result as the SDK's protobuf; None for anything else."""
    if isinstance(result, dict) and "loss_fn_outputs" in result:
        outputs = [{name: array(v) for name, v in out.items()} for out in result["loss_fn_outputs"]]
        metrics = {(k if k.count(":") == 1 else f"{k}:sum"): float(v) for k, v in result.get("metrics", {}).items()}
        return codec.encode_forward_backward_output(ForwardBackwardResult(
            outputs, metrics, result.get("loss_fn_output_type") or "TensorData"))
    if isinstance(result, dict) and "sequences" in result:
        sequences = [SampledSequence(list(s["tokens"]), list(s.get("logprobs") or []), StopReason(s["stop_reason"]))
                     for s in result["sequences"]]
        prompt = result.get("prompt_logprobs")
        prompt_logprobs = None if prompt is None else np.asarray(
            [np.nan if p is None else p for p in prompt], dtype=np.float32)
        return codec.encode_sample_response(SampleResult(sequences, prompt_logprobs))
    return None


def make_app(upstream: str, translate: bool) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=None)

    async def proxy(request: Request) -> Response:
        path, body = request.url.path, await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED}
        wants_proto = False
        if translate:
            if path == "/api/v1/client/config":
                return JSONResponse({})
            wants_proto = codec.PROTOBUF_CONTENT_TYPE in headers.pop("accept", "")
            if path == "/api/v1/forward_backward" and codec.PROTOBUF_CONTENT_TYPE in headers.get("content-type", ""):
                path, payload = forward_backward_json(body, request.headers.get("content-encoding"))
                body, headers["content-type"] = json.dumps(payload).encode(), "application/json"
        elif "content-encoding" in request.headers:
            headers["content-encoding"] = request.headers["content-encoding"]
        answer = await client.request(request.method, path, params=request.query_params, content=body,
                                      headers=headers)
        if wants_proto and answer.status_code == 200 and path == "/api/v1/retrieve_future":
            converted = result_proto(answer.json())
            if converted is not None:
                return Response(converted, media_type=codec.PROTOBUF_CONTENT_TYPE)
        if translate and path == "/api/v1/asample" and answer.status_code == 200:
            promise = answer.json()
            if promise.get("sample_sequence_ids") is None:  # SDK 0.38 asserts them; ids of this adapter's making
                count = int(json.loads(body).get("num_samples", 1))
                promise["sample_sequence_ids"] = [f"{promise.get('request_id')}-{i}" for i in range(count)]
            return JSONResponse(promise)
        kept = {k: v for k, v in answer.headers.items() if k.lower() == "content-type"}
        return Response(answer.content, status_code=answer.status_code, headers=kept)

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
    return Starlette(routes=[Route("/{path:path}", proxy, methods=methods)])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--translate", action="store_true")
    args = parser.parse_args()
    uvicorn.run(make_app(args.upstream, args.translate), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
