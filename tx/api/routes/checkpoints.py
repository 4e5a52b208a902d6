"""Checkpoints (rows 30-35): list, delete, publish, TTL, and signed URLs of external weights.

Registered before `runs`, so `.../checkpoints/{id}/publish` is not taken for a checkpoint id
ending in `/publish` by the DELETE route below (checkpoint ids hold a slash: `weights/step-1`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Query, Request

from tx.api.deps import MAX_OFFSET, Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses, safe_text
from tx.api.wire.schemas.base import Cursor
from tx.api.wire.schemas.checkpoints import (
    Checkpoint,
    CheckpointsListResponse,
    CheckpointTtlRequest,
    ExternalWeightsUrlsResponse,
)
from tx.core.checkpoints.files import CHECKPOINT_TYPE
from tx.core.views import CheckpointView

router = APIRouter(tags=["checkpoints"], responses=COMMON_ERRORS | error_responses(404))
CHECKPOINT = "/training_runs/{run_id}/checkpoints/{checkpoint_id:path}"


@router.get("/training_runs/{run_id}/checkpoints")
async def list_checkpoints(run_id: str, ctx: Ctx, caller: Caller) -> CheckpointsListResponse:
    views = await asyncio.to_thread(ctx.views.checkpoints, caller.owner, run_id)
    return CheckpointsListResponse(checkpoints=[checkpoint_view(v) for v in views])


@router.get("/checkpoints")
async def list_user_checkpoints(
    ctx: Ctx, caller: Caller, limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
) -> CheckpointsListResponse:
    views, total = await asyncio.to_thread(ctx.catalog.list_for_user, caller.owner, limit, offset)
    return CheckpointsListResponse(
        checkpoints=[checkpoint_view(v) for v in views], cursor=Cursor(offset=offset, limit=limit, total_count=total)
    )


@router.post(CHECKPOINT + "/publish")
async def publish(run_id: str, checkpoint_id: str, ctx: Ctx, caller: Caller) -> dict:
    await asyncio.to_thread(ctx.catalog.set_public, caller.owner, run_id, checkpoint_id, True)
    return {"public": True}


@router.delete(CHECKPOINT + "/publish")
async def unpublish(run_id: str, checkpoint_id: str, ctx: Ctx, caller: Caller) -> dict:
    await asyncio.to_thread(ctx.catalog.set_public, caller.owner, run_id, checkpoint_id, False)
    return {"public": False}


@router.put(CHECKPOINT + "/ttl")
async def set_ttl(run_id: str, checkpoint_id: str, body: CheckpointTtlRequest, ctx: Ctx, caller: Caller) -> dict:
    await asyncio.to_thread(ctx.catalog.set_ttl, caller.owner, run_id, checkpoint_id, body.ttl_seconds)
    return {"ttl_seconds": body.ttl_seconds}


@router.get(CHECKPOINT + "/external_weights_urls")
async def external_weights_urls(
    run_id: str, checkpoint_id: str, request: Request, ctx: Ctx, caller: Caller
) -> ExternalWeightsUrlsResponse:
    tokens, expires = await asyncio.to_thread(
        ctx.catalog.external_weights_links, caller.owner, run_id, checkpoint_id
    )
    base = download_base(request, ctx.settings.public_url)
    return ExternalWeightsUrlsResponse(urls={name: f"{base}/{t}" for name, t in tokens.items()}, expires=expires)


@router.delete(CHECKPOINT)
async def delete_checkpoint(run_id: str, checkpoint_id: str, ctx: Ctx, caller: Caller) -> dict:
    await asyncio.to_thread(ctx.catalog.delete, caller.owner, run_id, checkpoint_id)
    return {"deleted": f"tinker://{run_id}/{checkpoint_id}"}


def download_base(request: Request, public_url: str | None) -> str:
    """Where signed links point: --public-url if set, else the address this request came to."""
    root = public_url.rstrip("/") if public_url else str(request.base_url).rstrip("/")
    return f"{root}/api/v1/downloads"


def checkpoint_view(view: CheckpointView) -> Checkpoint:
    return Checkpoint(
        checkpoint_id=view.checkpoint_id,
        checkpoint_type=CHECKPOINT_TYPE[view.kind],
        time=view.created_at,
        tinker_path=view.tinker_path,
        size_bytes=view.size_bytes,
        public=view.public,
        user_metadata=str_values(view.user_metadata),
        expires_at=view.expires_at,
    )


def str_values(metadata: dict[str, Any] | None) -> dict[str, str] | None:
    """Metadata as text; anything not encodable (stored before requests were checked) is escaped."""
    return None if metadata is None else {safe_text(str(k)): safe_text(str(v)) for k, v in metadata.items()}
