"""Sessions: create, heartbeat, finish (410 once finished), and listing."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query

from tx.api.deps import MAX_OFFSET, Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.wire.schemas import (
    CreateSessionRequest,
    CreateSessionResponse,
    SessionFinishRequest,
    SessionHeartbeatRequest,
    SessionHeartbeatResponse,
)

router = APIRouter(tags=["sessions"], responses=COMMON_ERRORS | error_responses(404, 410))


@router.post("/create_session")
async def create_session(body: CreateSessionRequest, ctx: Ctx, caller: Caller) -> CreateSessionResponse:
    session_id = await asyncio.to_thread(
        ctx.service.create_session, caller.owner, body.sdk_version, body.tags, body.user_metadata or {}
    )
    return CreateSessionResponse(session_id=session_id)


@router.post("/session_heartbeat")
async def heartbeat(body: SessionHeartbeatRequest, ctx: Ctx, caller: Caller) -> SessionHeartbeatResponse:
    await asyncio.to_thread(ctx.store.heartbeat, body.session_id, caller.owner)
    return SessionHeartbeatResponse()


@router.post("/sessions/{session_id}/finish")
async def finish(session_id: str, body: SessionFinishRequest, ctx: Ctx, caller: Caller) -> dict:
    await asyncio.to_thread(ctx.service.finish_session, caller.owner, session_id, body.reason.type)
    return {"status": "finished"}


@router.get("/sessions")
async def list_sessions(
    ctx: Ctx, caller: Caller, limit: int = Query(20, ge=1, le=1000), offset: int = Query(0, ge=0, le=MAX_OFFSET)
) -> dict:
    ids = await asyncio.to_thread(ctx.store.list_sessions, caller.owner, limit, offset)
    return {"sessions": ids}
