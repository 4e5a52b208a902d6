"""create_app(settings): the HTTP face of tx. Its lifespan builds and supervises the service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from tx.api.auth import KeyChecker
from tx.api.routes import client, futures, runs, sampling, sessions, training
from tx.backends import create_backend
from tx.backends.base import TrainingBackend
from tx.config import Settings
from tx.core.checkpoints import CheckpointFiles
from tx.core.futures import FutureRegistry
from tx.core.scheduler import Scheduler
from tx.core.service import TrainingService
from tx.models.serve import resolve_served_models
from tx.store.store import SessionFinishedError, Store
from tx.types import ConflictError, NotFoundError, UserError

logger = logging.getLogger(__name__)


@dataclass
class Context:
    settings: Settings
    models: dict[str, Path]
    store: Store
    backend: TrainingBackend
    futures: FutureRegistry
    scheduler: Scheduler
    service: TrainingService


def build_context(settings: Settings, loop: asyncio.AbstractEventLoop) -> Context:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    models = resolve_served_models(settings)
    backend = create_backend(settings.backend, models, device=settings.device)
    store = Store.from_url(settings.store_url)
    futures_ = FutureRegistry(loop, settings.future_ttl_s)
    scheduler = Scheduler(futures_, settings.seq_gap_timeout_s)
    service = TrainingService(store, backend, futures_, scheduler, CheckpointFiles(settings.checkpoints_dir))
    logger.info("serving base models: %s", ", ".join(f"{n} ({p})" for n, p in models.items()))
    logger.info("data directory: %s; store: %s", settings.data_dir, _redact(settings.store_url))
    return Context(settings, models, store, backend, futures_, scheduler, service)


def create_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = build_context(settings, asyncio.get_running_loop())
        app.state.ctx = ctx
        ctx.scheduler.start()
        janitor = asyncio.create_task(_janitor(ctx))
        try:
            yield
        finally:
            janitor.cancel()
            ctx.scheduler.stop()
            ctx.store.close()

    app = FastAPI(title="tx", lifespan=lifespan)
    app.state.key_checker = KeyChecker(settings.api_keys)
    app.state.settings = settings
    for module in (client, sessions, training, futures, runs, sampling):
        app.include_router(module.router, prefix="/api/v1")
    _install_error_handlers(app)
    return app


async def _janitor(ctx: Context) -> None:
    """Drop old futures and expired checkpoints, once a minute."""
    while True:
        await asyncio.sleep(60)
        try:
            ctx.futures.expire()
            await asyncio.to_thread(ctx.service.delete_expired_checkpoints)
        except Exception:  # noqa: BLE001 - the janitor must never die
            logger.exception("janitor pass failed")


def _install_error_handlers(app: FastAPI) -> None:
    """The one place where domain errors become HTTP statuses. Every error has a JSON body."""

    def handler(status: int):
        async def handle(_: Request, exc: Exception) -> JSONResponse:
            return JSONResponse({"detail": str(exc)}, status_code=status)

        return handle

    app.add_exception_handler(UserError, handler(400))
    app.add_exception_handler(NotFoundError, handler(404))
    app.add_exception_handler(ConflictError, handler(409))
    app.add_exception_handler(SessionFinishedError, handler(410))

    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        return JSONResponse({"detail": errors}, status_code=422)

    app.add_exception_handler(RequestValidationError, invalid)


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
