"""Sessions: create, heartbeat, finish (410 once finished), list, get, project, search, trace."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query, Request

from tx.api.deps import MAX_OFFSET, Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.routes.checkpoints import download_base
from tx.api.wire.schemas.sessions import (
    AssignProjectRequest,
    CreateSessionRequest,
    CreateSessionResponse,
    GetSessionResponse,
    ListSessionsResponse,
    SessionFinishRequest,
    SessionHeartbeatRequest,
    SessionHeartbeatResponse,
    SessionSearchCursor,
    SessionSearchRequest,
    SessionSearchResponse,
    SessionSummary,
    TraceExportResponse,
)
from tx.core.sessions import SessionQuery, SessionStatus, SessionView

router = APIRouter(tags=["sessions"], responses=COMMON_ERRORS | error_responses(404, 410))


@router.post("/create_session")
async def create_session(body: CreateSessionRequest, ctx: Ctx, caller: Caller) -> CreateSessionResponse:
    session_id = await asyncio.to_thread(
        ctx.sessions.create, caller.owner, body.sdk_version, body.tags, body.user_metadata or {},
        body.project_id, body.display_name,
    )
    return CreateSessionResponse(session_id=session_id)


@router.post("/session_heartbeat")
async def heartbeat(body: SessionHeartbeatRequest, ctx: Ctx, caller: Caller) -> SessionHeartbeatResponse:
    await asyncio.to_thread(ctx.sessions.heartbeat, caller.owner, body.session_id)
    return SessionHeartbeatResponse()


@router.post("/sessions/{session_id}/finish")
async def finish(session_id: str, body: SessionFinishRequest, ctx: Ctx, caller: Caller) -> dict:
    await asyncio.to_thread(ctx.sessions.finish, caller.owner, session_id, body.reason.type)
    return {"status": "finished"}


@router.get("/sessions")
async def list_sessions(
    ctx: Ctx, caller: Caller, limit: int = Query(20, ge=1, le=1000), offset: int = Query(0, ge=0, le=MAX_OFFSET)
) -> ListSessionsResponse:
    ids = await asyncio.to_thread(ctx.sessions.list_ids, caller.owner, limit, offset)
    return ListSessionsResponse(sessions=ids)


@router.post("/sessions/search")
async def search(body: SessionSearchRequest, ctx: Ctx, caller: Caller) -> SessionSearchResponse:
    page, after = await asyncio.to_thread(ctx.sessions.search, caller.owner, _query(body))
    cursor = SessionSearchCursor(last_created_at=after[0], last_session_id=after[1]) if after else None
    return SessionSearchResponse(sessions=[_summary(s) for s in page], next_cursor=cursor)


@router.get("/sessions/{session_id}")
async def get_session(session_id: str, ctx: Ctx, caller: Caller) -> GetSessionResponse:
    found = await asyncio.to_thread(ctx.sessions.get, caller.owner, session_id)
    return GetSessionResponse(
        training_run_ids=found.training_run_ids, sampler_ids=found.sampler_ids,
        user_metadata=found.session.user_metadata, display_name=found.session.display_name,
    )


@router.put("/sessions/{session_id}/project")
async def assign_project(session_id: str, body: AssignProjectRequest, ctx: Ctx, caller: Caller) -> dict:
    await asyncio.to_thread(ctx.sessions.assign_project, caller.owner, session_id, body.project_id)
    return {"project_id": body.project_id}


@router.get("/sessions/{session_id}/trace_export")
async def trace_export(session_id: str, request: Request, ctx: Ctx, caller: Caller) -> TraceExportResponse:
    """Ready at once: the trace is built from the session's timeline when the link is fetched."""
    token = await asyncio.to_thread(ctx.sessions.trace_link, caller.owner, session_id)
    return TraceExportResponse(status="ready", url=f"{download_base(request, ctx.settings.public_url)}/{token}")


def _query(body: SessionSearchRequest) -> SessionQuery:
    statuses = None
    if body.statuses is not None:
        statuses = [SessionStatus(s.type, reason) for s in body.statuses for reason in (s.reasons or [None])]
    return SessionQuery(
        session_id=body.session_id, display_name=body.display_name, project_ids=body.project_ids,
        user_metadata=body.user_metadata, statuses=statuses, limit=body.limit,
        after=(body.cursor.last_created_at, body.cursor.last_session_id) if body.cursor else None,
    )


def _summary(session: SessionView) -> SessionSummary:
    status: dict = {"type": session.status.type}
    if session.status.type == "client_finished":
        status["reason"] = {"type": session.status.reason}
    elif session.status.type == "cancelled":
        status["detail"] = session.status.reason
    return SessionSummary(
        session_id=session.session_id, created_at=session.created_at, owner=session.owner,
        project_id=session.project_id, status=status, checkpoints_count=session.checkpoints_count,
        display_name=session.display_name, user_metadata=session.user_metadata,
        checkpoint_storage_bytes=session.checkpoint_bytes,
    )
