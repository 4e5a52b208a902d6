"""GET /metrics: Prometheus text format, behind an operator key when API keys are set."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tx.api.errors import error_responses

router = APIRouter(tags=["operators"], responses=error_responses(401, 403))


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    request.app.state.operator_checker(request)
    body = await asyncio.to_thread(generate_latest, request.app.state.metrics.registry)  # reads the store
    return Response(body, media_type=CONTENT_TYPE_LATEST)
