"""Sampling sessions: create one (from a base model or a tinker path) and look one up."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from tx.api.deps import Caller, Ctx
from tx.api.wire.schemas import (
    CreateSamplingSessionRequest,
    CreateSamplingSessionResponse,
    GetSamplerResponse,
)

router = APIRouter(tags=["sampling"])


@router.post("/create_sampling_session")
async def create_sampling_session(
    body: CreateSamplingSessionRequest, ctx: Ctx, caller: Caller
) -> CreateSamplingSessionResponse:
    sampler_id = await asyncio.to_thread(
        ctx.service.create_sampling_session, caller.owner, body.session_id,
        body.sampling_session_seq_id, body.base_model, body.model_path,
    )
    return CreateSamplingSessionResponse(sampling_session_id=sampler_id)


@router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, ctx: Ctx, caller: Caller) -> GetSamplerResponse:
    row = await asyncio.to_thread(ctx.store.get_sampling_session, sampler_id, caller.owner)
    return GetSamplerResponse(sampler_id=row.sampling_session_id, base_model=row.base_model,
                              model_path=row.model_path)
