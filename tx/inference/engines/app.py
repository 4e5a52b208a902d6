"""Every engine's HTTP face: `engine_app(backend)` serves the routes of `tx.inference.protocol`, nothing else,
over an `EngineBackend` (the embedded engine's `EmbeddedEngine`, tx's vLLM server's `VllmEngine`).

Every route except `GET /health` needs the cluster secret; errors follow `engines/http.py`. A backend's
operation is either a coroutine (awaited on the event loop: vLLM's, which wait on HTTP) or a plain method that
may block (pause, sleep, a weight transfer: the embedded engine's), which runs in the thread pool, as FastAPI
runs a plain `def` route. A generate request whose client disconnects is cancelled (`tx/disconnect.py`): the
backend aborts it (the embedded engine's rows leave the batch, vLLM's request is aborted).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from tx.disconnect import until_disconnected
from tx.inference import protocol as p
from tx.inference.engines.config import EngineProcessConfig
from tx.inference.engines.http import add_error_handlers, secret_guard
from tx.inference.engines.streaming import ndjson, whole
from tx.inference.weight_sync import TransferInit

T = TypeVar("T")
Answer = T | Awaitable[T]  # a plain method's result, or a coroutine's


class EngineBackend(Protocol):
    """The contract's operations, one method per route (`tx/inference/protocol/` says what each means)."""

    @property
    def config(self) -> EngineProcessConfig: ...

    def health(self) -> Answer[p.HealthResponse]: ...

    def generate(self, request: p.GenerateRequest) -> Answer[p.GenerateResponse]: ...

    def tokenize(self, request: p.TokenizeRequest) -> Answer[p.TokenizeResponse]: ...

    def pause(self, mode: p.PauseMode) -> Answer[p.StateResponse]: ...

    def resume(self) -> Answer[p.StateResponse]: ...

    def sleep(self, level: int, mode: p.PauseMode) -> Answer[p.StateResponse]: ...

    def wake_up(self, tags: list[p.WakeTag] | None) -> Answer[p.StateResponse]: ...

    def init_transfer(self, init: TransferInit) -> Answer[p.HealthResponse]: ...

    def update_weights(self, request: p.WeightsUpdateRequest) -> Answer[p.WeightsUpdateResponse]: ...

    def update_weights_ipc(self, request: p.IpcWeightsUpdateRequest) -> Answer[p.WeightsUpdateResponse]: ...

    def finish_weights(self, request: p.WeightsFinishRequest) -> Answer[p.HealthResponse]: ...

    def delete_adapter(self, name: str) -> Answer[p.HealthResponse]: ...


async def answer(operation: Callable[..., Any], *args: Any) -> Any:
    """Await a coroutine operation on the loop; run a plain one in the thread pool (it may block)."""
    if inspect.iscoroutinefunction(operation):
        return await operation(*args)
    return await run_in_threadpool(operation, *args)


def engine_app(backend: EngineBackend, title: str = "tx engine") -> FastAPI:
    app = FastAPI(title=title)
    add_error_handlers(app)
    guarded = secret_guard(backend.config.cluster_secret)

    @app.get(p.ROUTE_HEALTH)
    async def health() -> p.HealthResponse:
        return await answer(backend.health)

    @app.post(p.ROUTE_GENERATE, dependencies=guarded, response_model=p.GenerateResponse)
    async def generate(request: p.GenerateRequest, http: Request) -> Response:
        result: p.GenerateResponse = await until_disconnected(http, answer(backend.generate, request))
        return Response(result.model_dump_json(), media_type="application/json")  # built by us: no re-check

    @app.post(p.ROUTE_GENERATE_STREAM, dependencies=guarded)
    async def generate_stream(request: p.GenerateRequest) -> StreamingResponse:
        """NDJSON `GenerateEvent` lines (`engines/streaming.py`); a bad request is refused before the first."""
        stream = getattr(backend, "generate_stream", None)  # a backend without it streams its whole answer
        if stream is None:
            events = whole(await answer(backend.generate, request))
        else:
            events = await stream(request)
        return StreamingResponse(ndjson(events), media_type="application/x-ndjson")

    @app.post(p.ROUTE_TOKENIZE, dependencies=guarded)
    async def tokenize(request: p.TokenizeRequest) -> p.TokenizeResponse:
        return await answer(backend.tokenize, request)

    @app.post(p.ROUTE_PAUSE, dependencies=guarded)
    async def pause(request: p.PauseRequest) -> p.StateResponse:
        return await answer(backend.pause, request.mode)

    @app.post(p.ROUTE_RESUME, dependencies=guarded)
    async def resume() -> p.StateResponse:
        return await answer(backend.resume)

    @app.post(p.ROUTE_SLEEP, dependencies=guarded)
    async def sleep(request: p.SleepRequest) -> p.StateResponse:
        return await answer(backend.sleep, request.level, request.mode)

    @app.post(p.ROUTE_WAKE_UP, dependencies=guarded)
    async def wake_up(request: p.WakeUpRequest) -> p.StateResponse:
        return await answer(backend.wake_up, request.tags)

    @app.post(p.ROUTE_WEIGHTS_INIT, dependencies=guarded)
    async def weights_init(request: TransferInit) -> p.HealthResponse:
        return await answer(backend.init_transfer, request)

    @app.post(p.ROUTE_WEIGHTS_UPDATE, dependencies=guarded)
    async def weights_update(request: p.WeightsUpdateRequest) -> p.WeightsUpdateResponse:
        return await answer(backend.update_weights, request)

    @app.post(p.ROUTE_WEIGHTS_UPDATE_IPC, dependencies=guarded)
    async def weights_update_ipc(request: p.IpcWeightsUpdateRequest) -> p.WeightsUpdateResponse:
        return await answer(backend.update_weights_ipc, request)

    @app.post(p.ROUTE_WEIGHTS_FINISH, dependencies=guarded)
    async def weights_finish(request: p.WeightsFinishRequest) -> p.HealthResponse:
        return await answer(backend.finish_weights, request)

    @app.delete(p.ROUTE_ADAPTER, dependencies=guarded)
    async def delete_adapter(name: str) -> p.HealthResponse:
        return await answer(backend.delete_adapter, name)

    return app


__all__ = ["EngineBackend", "answer", "engine_app"]
