"""No request left waiting on tx's vLLM engine: when vLLM fails a call (answers an error status, as its API server
does for every request in flight when its engine core dies, or drops the connection), every request the failure
touched gets an error naming the cause, the request's other calls to vLLM are cancelled (so vLLM aborts them), and
the engine serves the next request (docs/engines.md#the-vllm-engine).

tx's own code runs for real, in this process: `VllmEngine`, `VllmChild`, the engine app, and the manager's
`InferenceClient` and `engine_error`. vLLM is `FakeVllm`, fault injection: an httpx transport in place of the
child's Unix socket that answers like vLLM's `/v1/completions`, and fails one body, or every call, as a test says.
(A real vLLM is started by tests/vllm_engine only: a vLLM start costs ~30 s of a core, and a fault inside it
cannot be injected without a hook in vLLM or in tx.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from tx.inference import protocol as p
from tx.inference.engines.app import engine_app
from tx.inference.engines.vllm.child import VllmChild
from tx.inference.engines.vllm.config import VllmEngineConfig
from tx.inference.engines.vllm.server import VllmEngine
from tx.inference.manager.client import EngineRequestError, InferenceClient
from tx.inference.manager.facade import engine_error

SECRET = "vllm-faults-secret"
WAIT_S = 10.0
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
"""What vLLM's API server answers (500) for each request in flight when its engine core dies."""
DROPPED = "Server disconnected without sending a response."


class FakeVllm:
    """Fault injection: vLLM's `/v1/completions` behind an httpx transport. Healthy, it answers each body with its
    `n` samples of one token. `fail_seed`: the body with that seed is answered 500 (`ENGINE_DEAD`) while the
    others wait until they are cancelled (counted in `cancelled`). `drop`: every call loses its connection, before
    its answer or, streamed, after its first chunk."""

    def __init__(self) -> None:
        self.fail_seed: int | None = None
        self.drop = False
        self.started = 0
        self.cancelled = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.started += 1
        if body.get("stream"):
            return httpx.Response(200, content=self._chunks(body))
        if self.drop:
            raise httpx.RemoteProtocolError(DROPPED, request=request)
        if self.fail_seed is not None and body.get("seed") == self.fail_seed:
            error = {"message": ENGINE_DEAD, "type": "InternalServerError", "code": 500}
            return httpx.Response(500, json={"error": error})
        if self.fail_seed is not None:
            try:
                await asyncio.Event().wait()  # generating until vLLM aborts it
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return httpx.Response(200, json={"choices": [_choice(i, "length") for i in range(body["n"])]})

    async def _chunks(self, body: dict) -> AsyncIterator[bytes]:
        yield f"data: {json.dumps({'choices': [_choice(0, None)]})}\n\n".encode()
        if self.drop:
            raise httpx.RemoteProtocolError(DROPPED)
        yield f"data: {json.dumps({'choices': [_choice(0, 'length', tokens=0)]})}\n\n".encode()
        yield b"data: [DONE]\n\n"


def _choice(index: int, finish: str | None, tokens: int = 1) -> dict:
    return {"index": index, "finish_reason": finish, "token_ids": [3] * tokens,
            "logprobs": {"token_logprobs": [-1.0] * tokens}}


Test = Callable[[FakeVllm, VllmEngine, InferenceClient], Awaitable[None]]


def run(tmp_path: Path, test: Test) -> None:
    """`test(vllm, engine, client)` on a `VllmEngine` over `FakeVllm`, with the manager's client in front of its app
    (in this process, over ASGI)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    config = VllmEngineConfig(model_dir=tmp_path, cluster_secret=SECRET)

    async def main() -> None:
        vllm = FakeVllm()
        child = VllmChild(config, tmp_path, "tx-base", sleep_mode=False)
        child._http = httpx.AsyncClient(transport=httpx.MockTransport(vllm.handle), base_url="http://vllm")
        engine = VllmEngine(config, child, tmp_path)
        client = InferenceClient(engines={"e0": "http://engine"}, secret=SECRET)
        app = httpx.ASGITransport(app=engine_app(engine), raise_app_exceptions=False)  # a 500, as uvicorn answers
        client._http = httpx.AsyncClient(transport=app, headers={p.SECRET_HEADER: SECRET}, timeout=WAIT_S)
        try:
            await asyncio.wait_for(test(vllm, engine, client), WAIT_S * 3)
        finally:
            await client.aclose()
            await child.http.aclose()

    asyncio.run(main())


def request(**options) -> p.GenerateRequest:
    return p.GenerateRequest(**{"prompt_token_ids": [5, 6, 7], "max_tokens": 1, "temperature": 1.0, **options})


async def failure(call: Awaitable[object]) -> EngineRequestError:
    """The engine's error answer to `call` (which must fail, within WAIT_S)."""
    with pytest.raises(EngineRequestError) as info:
        await asyncio.wait_for(call, WAIT_S)
    return info.value


async def serves(engine: VllmEngine, client: InferenceClient) -> None:
    """No request left running on the engine, and it serves the next one."""
    assert engine.num_running == engine.num_waiting == 0
    answer = await client.generate("e0", "s", request(n=2))
    assert [s.token_ids for s in answer.sequences] == [[3], [3]]


def test_an_error_vllm_answers_fails_the_request_and_cancels_its_other_calls(tmp_path):
    async def test(vllm: FakeVllm, engine: VllmEngine, client: InferenceClient) -> None:
        vllm.fail_seed = 101  # a seeded request of n = 3 is 3 bodies (seeds 100, 101, 102), sent at once
        error = await failure(client.generate("e0", "s", request(n=3, seed=100)))
        assert (error.status, error.detail) == (500, ENGINE_DEAD)
        assert str(engine_error(error)) == f"engine e0 answered 500: {ENGINE_DEAD}"  # what the sample fails with
        while vllm.cancelled < 2:  # the bodies still generating are cancelled: vLLM aborts them
            await asyncio.sleep(0.01)
        assert vllm.started == 3
        vllm.fail_seed = None
        await serves(engine, client)

    run(tmp_path, test)


def test_a_vllm_that_drops_the_connection_fails_the_request_naming_it(tmp_path):
    async def test(vllm: FakeVllm, engine: VllmEngine, client: InferenceClient) -> None:
        vllm.drop = True
        error = await failure(client.generate("e0", "s", request()))
        assert error.status == 502
        assert error.detail == f"vLLM did not answer POST /v1/completions: RemoteProtocolError: {DROPPED}"
        vllm.drop = False
        await serves(engine, client)

    run(tmp_path, test)


def test_a_stream_whose_vllm_drops_the_connection_ends_with_an_error_naming_it(tmp_path):
    async def test(vllm: FakeVllm, engine: VllmEngine, client: InferenceClient) -> None:
        heard: list[int] = []
        vllm.drop = True
        call = client.generate("e0", "s", request(max_tokens=2), on_tokens=lambda i, tokens, lps: heard.extend(tokens))
        error = await failure(call)
        assert heard == [3]  # the token before the drop was streamed
        assert (error.status, error.detail) == (502, f"vLLM did not answer POST /v1/completions: "
                                                     f"RemoteProtocolError: {DROPPED}")
        vllm.drop = False
        await serves(engine, client)

    run(tmp_path, test)


def test_audio_is_a_400_at_the_request_and_never_reaches_vllm(tmp_path):
    """The pinned vLLM has no Inkling audio: tx's vLLM engine refuses a prompt with clips before vLLM sees it, as
    the user's error (docs/model-families.md#audio-in)."""
    import numpy as np

    from tx.types import UserError

    async def test(vllm: FakeVllm, engine: VllmEngine, client: InferenceClient) -> None:
        clip = p.PromptAudio.of(np.zeros((2, 8), np.int64), 1)
        error = await failure(client.generate("e0", "s", request(prompt_token_ids=[5, 7, 7], audio=[clip])))
        assert isinstance(engine_error(error), UserError) and "audio" in str(error) and "vLLM" in str(error)
        assert vllm.started == 0
        await serves(engine, client)

    run(tmp_path, test)
