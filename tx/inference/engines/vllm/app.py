"""The vLLM engine's HTTP face: the routes of `tx.inference.protocol` (plus `POST /weights/update_ipc`).

Every route except `GET /health` needs the cluster secret. Errors follow `engines/http.py`; an error status
from vLLM keeps its status, with its message as `detail`.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response

from tx.inference import protocol as p
from tx.inference.engines.http import add_error_handlers, secret_guard
from tx.inference.engines.vllm.server import VllmEngine, VllmError
from tx.inference.weight_sync import TransferInit


def create_app(engine: VllmEngine) -> FastAPI:
    app = FastAPI(title="tx vLLM engine")
    add_error_handlers(app, {VllmError: lambda exc: exc.status if isinstance(exc, VllmError) else 500})
    guarded = secret_guard(engine.config.cluster_secret)

    @app.get(p.ROUTE_HEALTH)
    async def health() -> p.HealthResponse:
        await engine.transfer_state()
        return engine.health()

    @app.post(p.ROUTE_GENERATE, dependencies=guarded, response_model=p.GenerateResponse)
    async def generate(request: p.GenerateRequest) -> Response:
        result = await engine.generate(request)
        return Response(result.model_dump_json(), media_type="application/json")

    @app.post(p.ROUTE_TOKENIZE, dependencies=guarded)
    async def tokenize(request: p.TokenizeRequest) -> p.TokenizeResponse:
        return await engine.tokenize(request)

    @app.post(p.ROUTE_PAUSE, dependencies=guarded)
    async def pause(request: p.PauseRequest) -> p.StateResponse:
        return await engine.pause(request.mode)

    @app.post(p.ROUTE_RESUME, dependencies=guarded)
    async def resume() -> p.StateResponse:
        return await engine.resume()

    @app.post(p.ROUTE_SLEEP, dependencies=guarded)
    async def sleep(request: p.SleepRequest) -> p.StateResponse:
        return await engine.sleep(request.level, request.mode)

    @app.post(p.ROUTE_WAKE_UP, dependencies=guarded)
    async def wake_up(request: p.WakeUpRequest) -> p.StateResponse:
        return await engine.wake_up(request.tags)

    @app.post(p.ROUTE_WEIGHTS_INIT, dependencies=guarded)
    async def weights_init(request: TransferInit) -> p.HealthResponse:
        return await engine.init_transfer(request)

    @app.post(p.ROUTE_WEIGHTS_UPDATE, dependencies=guarded)
    async def weights_update(request: p.WeightsUpdateRequest) -> p.WeightsUpdateResponse:
        return await engine.update_weights(request)

    @app.post(p.ROUTE_WEIGHTS_UPDATE_IPC, dependencies=guarded)
    async def weights_update_ipc(request: p.IpcWeightsUpdateRequest) -> p.WeightsUpdateResponse:
        return await engine.update_weights_ipc(request)

    @app.post(p.ROUTE_WEIGHTS_FINISH, dependencies=guarded)
    async def weights_finish(request: p.WeightsFinishRequest) -> p.HealthResponse:
        return await engine.finish_weights(request)

    @app.delete(p.ROUTE_ADAPTER, dependencies=guarded)
    async def delete_adapter(name: str) -> p.HealthResponse:
        return await engine.delete_adapter(name)

    return app
