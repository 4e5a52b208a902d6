"""Training runs and weights_info (REST reads; checkpoints are in `checkpoints`)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query

from tx.api.deps import MAX_OFFSET, Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses, safe_text
from tx.api.routes.checkpoints import checkpoint_view, str_values, utc
from tx.api.wire.rest_schemas import (
    Cursor,
    TrainingRun,
    TrainingRunsResponse,
    WeightsInfoRequest,
    WeightsInfoResponse,
)
from tx.core.checkpoints import TinkerPath
from tx.store.tables import CheckpointRow, TrainingRunRow

router = APIRouter(tags=["runs"], responses=COMMON_ERRORS | error_responses(404, 409))


@router.get("/training_runs")
async def list_runs(
    ctx: Ctx, caller: Caller, limit: int = Query(20, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
) -> TrainingRunsResponse:
    rows, total = await asyncio.to_thread(ctx.store.list_runs, caller.owner, limit, offset)
    runs = await asyncio.to_thread(_runs, ctx, rows)
    return TrainingRunsResponse(
        training_runs=runs, cursor=Cursor(offset=offset, limit=limit, total_count=total)
    )


@router.get("/training_runs/{run_id}")
async def get_run(run_id: str, ctx: Ctx, caller: Caller) -> TrainingRun:
    row = await asyncio.to_thread(ctx.store.get_run, run_id, caller.owner)
    return (await asyncio.to_thread(_runs, ctx, [row]))[0]


@router.post("/weights_info")
async def weights_info(body: WeightsInfoRequest, ctx: Ctx, caller: Caller) -> WeightsInfoResponse:
    path = TinkerPath.parse(body.tinker_path)
    row = await asyncio.to_thread(
        ctx.store.get_checkpoint, path.run_id, path.checkpoint_id, caller.owner, public_ok=True
    )
    run = await asyncio.to_thread(ctx.store.get_run, path.run_id, row.owner)
    lora = run.lora_config
    return WeightsInfoResponse(
        base_model=run.base_model,
        is_lora=True,
        lora_rank=run.lora_rank,
        train_unembed=lora.get("train_unembed"),
        train_mlp=lora.get("train_mlp"),
        train_attn=lora.get("train_attn"),
    )


def _runs(ctx: Ctx, rows: list[TrainingRunRow]) -> list[TrainingRun]:
    """The API view of `rows`, their newest checkpoints read in one query."""
    latest = ctx.store.latest_checkpoints([r.run_id for r in rows], ("weights", "sampler_weights"))
    return [_run(row, latest.get((row.run_id, "weights")), latest.get((row.run_id, "sampler_weights")))
            for row in rows]


def _run(row: TrainingRunRow, last: CheckpointRow | None, last_sampler: CheckpointRow | None) -> TrainingRun:
    return TrainingRun(
        training_run_id=row.run_id,
        base_model=row.base_model,
        model_owner=row.owner,
        is_lora=True,
        last_request_time=utc(row.last_request_time),
        corrupted=row.corrupted,
        lora_rank=row.lora_rank,
        last_checkpoint=checkpoint_view(last) if last else None,
        last_sampler_checkpoint=checkpoint_view(last_sampler) if last_sampler else None,
        user_metadata=str_values(row.user_metadata),
    )
