"""Training runs, their checkpoints, and weights_info (REST reads and checkpoint deletion)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Query

from tx.api.deps import MAX_OFFSET, Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses, safe_text
from tx.api.wire.rest_schemas import (
    Checkpoint,
    CheckpointsListResponse,
    Cursor,
    TrainingRun,
    TrainingRunsResponse,
    WeightsInfoRequest,
    WeightsInfoResponse,
)
from tx.core.checkpoints import CHECKPOINT_TYPE, TinkerPath
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


@router.get("/training_runs/{run_id}/checkpoints")
async def list_checkpoints(run_id: str, ctx: Ctx, caller: Caller) -> CheckpointsListResponse:
    rows = await asyncio.to_thread(ctx.store.list_checkpoints, run_id, caller.owner)
    return CheckpointsListResponse(checkpoints=[_checkpoint(r) for r in rows])


@router.delete("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}")
async def delete_checkpoint(run_id: str, checkpoint_id: str, ctx: Ctx, caller: Caller) -> dict:
    await asyncio.to_thread(ctx.service.delete_checkpoint, caller.owner, run_id, checkpoint_id)
    return {"deleted": f"tinker://{run_id}/{checkpoint_id}"}


@router.post("/weights_info")
async def weights_info(body: WeightsInfoRequest, ctx: Ctx, caller: Caller) -> WeightsInfoResponse:
    path = TinkerPath.parse(body.tinker_path)
    await asyncio.to_thread(ctx.store.get_checkpoint, path.run_id, path.checkpoint_id, caller.owner)
    run = await asyncio.to_thread(ctx.store.get_run, path.run_id, caller.owner)
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
        last_request_time=_utc(row.last_request_time),
        corrupted=row.corrupted,
        lora_rank=row.lora_rank,
        last_checkpoint=_checkpoint(last) if last else None,
        last_sampler_checkpoint=_checkpoint(last_sampler) if last_sampler else None,
        user_metadata=_str_values(row.user_metadata),
    )


def _checkpoint(row: CheckpointRow) -> Checkpoint:
    return Checkpoint(
        checkpoint_id=row.checkpoint_id,
        checkpoint_type=CHECKPOINT_TYPE[row.kind],
        time=_utc(row.created_at),
        tinker_path=f"tinker://{row.run_id}/{row.checkpoint_id}",
        size_bytes=row.size_bytes,
        user_metadata=_str_values(row.user_metadata),
        expires_at=_utc(row.expires_at) if row.expires_at else None,
    )


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _str_values(metadata: dict[str, Any] | None) -> dict[str, str] | None:
    """Metadata as text; anything not encodable (stored before requests were checked) is escaped."""
    return None if metadata is None else {safe_text(str(k)): safe_text(str(v)) for k, v in metadata.items()}
