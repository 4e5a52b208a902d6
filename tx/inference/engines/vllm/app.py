"""The vLLM engine's HTTP face: the routes of `tx.inference.protocol` (plus `POST /weights/update_ipc`).

Every route except `GET /health` needs the cluster secret. Errors map to statuses in one place: UserError
-> 400, NotFoundError -> 404, ConflictError -> 409, an error status from vLLM -> the same status with its
message as `detail`, anything else -> 500.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from tx.inference import protocol as p
from tx.inference.engines.vllm.server import IpcWeightsUpdateRequest, VllmEngine, VllmError
from tx.inference.weight_sync import TransferInit
from tx.types import ConflictError, NotFoundError, UserError

ROUTE_WEIGHTS_UPDATE_IPC = "/weights/update_ipc"
_ERROR_STATUS = {UserError: 400, NotFoundError: 404, ConflictError: 409}


def create_app(engine: VllmEngine) -> FastAPI:
    secret = engine.config.cluster_secret.encode()

    def require_secret(value: Annotated[str | None, Header(alias=p.SECRET_HEADER)] = None) -> None:
        if value is None or not hmac.compare_digest(value.encode(), secret):
            raise HTTPException(status_code=401, detail=f"missing or wrong {p.SECRET_HEADER}")

    app = FastAPI(title="tx vLLM engine")
    _add_error_handlers(app)
    guarded = [Depends(require_secret)]

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

    @app.post(ROUTE_WEIGHTS_UPDATE_IPC, dependencies=guarded)
    async def weights_update_ipc(request: IpcWeightsUpdateRequest) -> p.WeightsUpdateResponse:
        return await engine.update_weights_ipc(request)

    @app.post(p.ROUTE_WEIGHTS_FINISH, dependencies=guarded)
    async def weights_finish(request: p.WeightsFinishRequest) -> p.HealthResponse:
        return await engine.finish_weights(request)

    @app.delete(p.ROUTE_ADAPTER, dependencies=guarded)
    async def delete_adapter(name: str) -> p.HealthResponse:
        return await engine.delete_adapter(name)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    for error, status in _ERROR_STATUS.items():

        async def handler(request: Request, exc: Exception, status: int = status) -> JSONResponse:
            return JSONResponse(status_code=status, content={"detail": str(exc)})

        app.add_exception_handler(error, handler)

    async def from_vllm(request: Request, exc: VllmError) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content={"detail": str(exc)})

    app.add_exception_handler(VllmError, from_vllm)

    async def internal(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=500, content={"detail": f"{type(exc).__name__}: {exc}"})

    app.add_exception_handler(Exception, internal)
