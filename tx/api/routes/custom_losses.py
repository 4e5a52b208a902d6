"""create_custom_loss: upload a traced loss (checked against the trainer's allowlist) for forward_backward."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from tx.api.deps import Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.wire.schemas.custom_losses import CreateCustomLossRequest
from tx.api.wire.schemas.futures import UntypedAPIFuture

router = APIRouter(tags=["training"], responses=COMMON_ERRORS | error_responses(404, 410))


@router.post("/create_custom_loss")
async def create_custom_loss(body: CreateCustomLossRequest, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    inputs = [(item.name, item.rank) for item in body.inputs]
    nodes = [node.model_dump() for node in body.graph.nodes]
    future = await asyncio.to_thread(
        ctx.custom_losses.create, caller.owner, body.session_id, body.custom_loss_seq_id, body.name,
        inputs, nodes,
    )
    return UntypedAPIFuture(request_id=future.request_id)
