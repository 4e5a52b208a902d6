"""The embedded engine's HTTP face: the routes of `tx.inference.protocol`, nothing else.

Every route except `GET /health` needs the cluster secret; errors follow `engines/http.py`. Blocking
operations (pause, sleep, weight transfer) are plain `def` routes, so FastAPI runs them in its thread pool.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from fastapi.responses import Response

from tx.inference import protocol as p
from tx.inference.engines.embedded.engine import EmbeddedEngine
from tx.inference.engines.http import add_error_handlers, secret_guard
from tx.inference.weight_sync import TransferInit


def create_app(engine: EmbeddedEngine) -> FastAPI:
    app = FastAPI(title="tx embedded engine")
    add_error_handlers(app)
    guarded = secret_guard(engine.config.cluster_secret)

    @app.get(p.ROUTE_HEALTH)
    def health() -> p.HealthResponse:
        return engine.health()

    @app.post(p.ROUTE_GENERATE, dependencies=guarded, response_model=p.GenerateResponse)
    async def generate(request: p.GenerateRequest) -> Response:
        if request.images:  # decoding and processing images is CPU work: keep it off the event loop
            future = await asyncio.to_thread(engine.submit, request)
        else:
            future = engine.submit(request)
        result = await asyncio.wrap_future(future)
        return Response(result.model_dump_json(), media_type="application/json")  # built by us: no re-check

    @app.post(p.ROUTE_TOKENIZE, dependencies=guarded)
    def tokenize(request: p.TokenizeRequest) -> p.TokenizeResponse:
        return p.TokenizeResponse(token_ids=engine.tokenize(request.text, request.add_special_tokens))

    @app.post(p.ROUTE_PAUSE, dependencies=guarded)
    def pause(request: p.PauseRequest) -> p.StateResponse:
        return engine.pause(request.mode)

    @app.post(p.ROUTE_RESUME, dependencies=guarded)
    def resume() -> p.StateResponse:
        return engine.resume()

    @app.post(p.ROUTE_SLEEP, dependencies=guarded)
    def sleep(request: p.SleepRequest) -> p.StateResponse:
        return engine.sleep(request.level, request.mode)

    @app.post(p.ROUTE_WAKE_UP, dependencies=guarded)
    def wake_up(request: p.WakeUpRequest) -> p.StateResponse:
        return engine.wake_up(request.tags)

    @app.post(p.ROUTE_WEIGHTS_INIT, dependencies=guarded)
    def weights_init(request: TransferInit) -> p.HealthResponse:
        return engine.init_transfer(request)

    @app.post(p.ROUTE_WEIGHTS_UPDATE, dependencies=guarded)
    def weights_update(request: p.WeightsUpdateRequest) -> p.WeightsUpdateResponse:
        return engine.update_weights(request)

    @app.post(p.ROUTE_WEIGHTS_UPDATE_IPC, dependencies=guarded)
    def weights_update_ipc(request: p.IpcWeightsUpdateRequest) -> p.WeightsUpdateResponse:
        return engine.update_weights_ipc(request)

    @app.post(p.ROUTE_WEIGHTS_FINISH, dependencies=guarded)
    def weights_finish(request: p.WeightsFinishRequest) -> p.HealthResponse:
        return engine.finish_weights(request)

    @app.delete(p.ROUTE_ADAPTER, dependencies=guarded)
    def delete_adapter(name: str) -> p.HealthResponse:
        return engine.delete_adapter(name)

    return app
