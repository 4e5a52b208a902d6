"""Client bootstrap and server facts: client/config, healthz, capabilities, telemetry."""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import APIRouter, Response

from tx.api.deps import Caller, Ctx, Operator
from tx.api.errors import COMMON_ERRORS
from tx.api.usage import UsageReport, usage_report
from tx.api.wire.schemas.client import (
    ClientConfigRequest,
    ClientConfigResponse,
    ClientDynamicConfigResponse,
    GetServerCapabilitiesResponse,
    HealthResponse,
    ModelLoading,
    SupportedModel,
    TelemetryResponse,
    TelemetrySendRequest,
)
from tx.models.loading import in_progress

logger = logging.getLogger(__name__)
router = APIRouter(tags=["client"], responses=COMMON_ERRORS)
FWDBWD_CHUNK_BYTES = 5_000_000  # the SDK's default estimated bytes per forward_backward chunk


@router.post("/client/config")
async def client_config(
    body: ClientConfigRequest, ctx: Ctx, _: Caller, response: Response
) -> ClientConfigResponse:
    # The SDK fetches this with a one-off httpx client on its background loop and never closes it.
    # Left open, that keep-alive connection is finalized later by the cyclic GC in whatever thread
    # runs it; with an event loop running there (tinker-cookbook's asyncio.run), httpx's __del__
    # schedules aclose() on that loop, which calls remove_reader(fd) on the SDK loop's selector long
    # after the fd number was reused by a live connection (often a retrieve_future long-poll): that
    # request never sees its response and stalls until the SDK's 45-60 s read timeout. Closing the
    # connection here makes the client close it at once, on its own loop, leaving nothing to tear down.
    response.headers["Connection"] = "close"
    settings = ctx.settings
    return ClientConfigResponse(
        pjwt_auth_enabled=settings.jwt_auth,
        proto_compress_fwdbwd=settings.proto_compress_fwdbwd,
        # a chunk's estimate must stay under the route's body limit, with room for the estimate's error
        fwdbwd_max_chunk_bytes_count=min(FWDBWD_CHUNK_BYTES, settings.max_request_bytes // 2),
        sample_max_concurrent_requests=settings.sampling_max_queue,  # more would only get 429s
        sample_use_retrieve_futures=settings.sample_use_retrieve_futures,
        custom_loss_server_side=ctx.base_models.runs_custom_losses(),
        sample_join_sampling_session=settings.sample_join_sampling_session,
    )


@router.post("/client/dynamic_config")
async def client_dynamic_config(body: ClientConfigRequest, _: Caller) -> ClientDynamicConfigResponse:
    """tx stops a sample whose client gave up on it (cancel_future), so clients may send those cancels."""
    return ClientDynamicConfigResponse(sample_cancel_enabled=True)


@router.get("/healthz")
async def healthz() -> HealthResponse:
    """ok once the server answers; with the base models this process is loading now and how far each is."""
    now = time.time()
    return HealthResponse(loading=[ModelLoading(model=load.model, fraction=load.fraction(), seconds=now - load.started)
                                   for load in in_progress()])


@router.get("/get_server_capabilities")
async def capabilities(ctx: Ctx, _: Caller) -> GetServerCapabilitiesResponse:
    models = [
        SupportedModel(
            model_name=m.name, max_context_length=m.max_context_length, trainable=True, sampleable=True
        )
        for m in ctx.base_models.served()
    ]
    return GetServerCapabilitiesResponse(supported_models=models)


@router.get("/tx/engines")
async def engines(ctx: Ctx, _: Operator) -> dict:
    """tx's own, for operators: the inference engines, their state, weight versions and health."""
    return {"groups": await ctx.manager.describe()}


@router.get("/tx/usage")
async def usage(ctx: Ctx, _: Operator) -> UsageReport:
    """tx's own, for operators: every key's use of its quotas (sessions, runs, queued work, samples in flight,
    checkpoint bytes, custom losses) and the tokens it trained and sampled (tx/core/quotas.py)."""
    return await asyncio.to_thread(usage_report, ctx, ctx.settings.quotas)


@router.post("/telemetry")
async def telemetry(body: TelemetrySendRequest, _: Caller) -> TelemetryResponse:
    logger.debug("telemetry: %d events from session %s", len(body.events), body.session_id)
    return TelemetryResponse()
