"""Training runs and weights_info (REST reads; checkpoints are in `checkpoints`)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query

from tx.api.deps import MAX_OFFSET, Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.routes.checkpoints import checkpoint_view, str_values
from tx.api.wire.convert import optimizer_config_to_wire
from tx.api.wire.schemas.base import Cursor
from tx.api.wire.schemas.runs import (
    TrainingRun,
    TrainingRunsResponse,
    WeightsInfoRequest,
    WeightsInfoResponse,
)
from tx.core.views import RunView

router = APIRouter(tags=["runs"], responses=COMMON_ERRORS | error_responses(404, 409))


@router.get("/training_runs")
async def list_runs(
    ctx: Ctx, caller: Caller, limit: int = Query(20, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
) -> TrainingRunsResponse:
    runs, total = await asyncio.to_thread(ctx.views.list, caller.owner, limit, offset)
    return TrainingRunsResponse(
        training_runs=[_run(r) for r in runs], cursor=Cursor(offset=offset, limit=limit, total_count=total)
    )


@router.get("/training_runs/{run_id}")
async def get_run(run_id: str, ctx: Ctx, caller: Caller) -> TrainingRun:
    return _run(await asyncio.to_thread(ctx.views.get, caller.owner, run_id))


@router.post("/weights_info")
async def weights_info(body: WeightsInfoRequest, ctx: Ctx, caller: Caller) -> WeightsInfoResponse:
    run = await asyncio.to_thread(ctx.views.weights_of, caller.owner, body.tinker_path)
    return WeightsInfoResponse(
        base_model=run.base_model,
        is_lora=True,
        lora_rank=run.lora.rank,
        train_unembed=run.lora.train_unembed,
        train_mlp=run.lora.train_mlp,
        train_attn=run.lora.train_attn,
        optimizer_config=optimizer_config_to_wire(run.optimizer),
    )


def _run(run: RunView) -> TrainingRun:
    return TrainingRun(
        training_run_id=run.run_id,
        base_model=run.base_model,
        model_owner=run.owner,
        is_lora=True,
        last_request_time=run.last_request_time,
        corrupted=run.corrupted,
        lora_rank=run.lora.rank,
        last_checkpoint=checkpoint_view(run.last_checkpoint) if run.last_checkpoint else None,
        last_sampler_checkpoint=checkpoint_view(run.last_sampler_checkpoint) if run.last_sampler_checkpoint else None,
        user_metadata=str_values(run.user_metadata),
        name=run.name, tags=list(run.tags), base_revision=run.base_revision, base_fingerprint=run.base_fingerprint,
    )
