"""`POST /api/v1/tx/checkpoints/merge` (tx's own, behind `tx checkpoints merge`): a checkpoint of the caller's
merged into its base model on the server, kept as `external_weights/<name>` of its run
(`tx/core/checkpoints/merges.py`). The answer is a future whose result is `{"path", "size_bytes"}`."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from tx.api.deps import Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.wire.schemas.checkpoints import MergeCheckpointRequest
from tx.api.wire.schemas.futures import UntypedAPIFuture

router = APIRouter(tags=["checkpoints"], responses=COMMON_ERRORS | error_responses(404))


@router.post("/tx/checkpoints/merge")
async def merge_checkpoint(body: MergeCheckpointRequest, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    future = await asyncio.to_thread(ctx.merges.submit, caller.owner, body.source_path, body.name, body.ttl_seconds)
    return UntypedAPIFuture(request_id=future.request_id, model_id=None)
