"""copy_weights (row 26): a checkpoint copied into the caller's project or session, sharing its bytes."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Header, Request

from tx.api.deps import Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.wire.schemas.copies import CopyWeightsRequest, CopyWeightsResponse
from tx.core.checkpoints.copies import CopyTarget

router = APIRouter(tags=["checkpoints"], responses=COMMON_ERRORS | error_responses(404, 409))


@router.post("/copy_weights")
async def copy_weights(
    body: CopyWeightsRequest, request: Request, ctx: Ctx, caller: Caller,
    x_idempotency_key: str | None = Header(None, max_length=160),
    x_tinker_weights_access_token: str | None = Header(None, max_length=4096),
) -> CopyWeightsResponse:
    """The source is read as the caller, or as the owner of the weights access token (a key or token of
    theirs); the copy is the caller's."""
    token = x_tinker_weights_access_token or body.weights_access_token
    reader = request.app.state.key_checker.principal(token).owner if token else None
    target = CopyTarget(project_id=body.destination_project_id, session_id=body.session_id,
                        model_seq_id=body.model_seq_id)
    path = await asyncio.to_thread(ctx.copies.copy, caller.owner, body.source_path, target, body.ttl_seconds,
                                   x_idempotency_key, reader)
    return CopyWeightsResponse(tinker_path=path)
