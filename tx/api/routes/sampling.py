"""Sampling: sessions (from a base model or a tinker path), lookup, and asample."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from tx.api.deps import Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.wire.convert import sample_request_to_domain
from tx.api.wire.schemas.asample import SampleRequestJson
from tx.api.wire.schemas.futures import UntypedAPIFuture
from tx.api.wire.schemas.sampling import (
    CreateSamplingSessionRequest,
    CreateSamplingSessionResponse,
    GetSamplerResponse,
    JoinSamplingSessionRequest,
    JoinSamplingSessionResponse,
)
from tx.types import UserError

router = APIRouter(tags=["sampling"], responses=COMMON_ERRORS | error_responses(404, 429))


@router.post("/create_sampling_session")
async def create_sampling_session(
    body: CreateSamplingSessionRequest, ctx: Ctx, caller: Caller
) -> CreateSamplingSessionResponse:
    sampler_id = await asyncio.to_thread(
        ctx.samplers.create, caller.owner, body.session_id,
        body.sampling_session_seq_id, body.base_model, body.model_path,
    )
    return CreateSamplingSessionResponse(sampling_session_id=sampler_id)


@router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, ctx: Ctx, caller: Caller) -> GetSamplerResponse:
    view = await asyncio.to_thread(ctx.samplers.describe, caller.owner, sampler_id)
    return GetSamplerResponse(sampler_id=view.sampler_id, base_model=view.base_model, model_path=view.model_path)


@router.post("/join_sampling_session")
async def join_sampling_session(
    body: JoinSamplingSessionRequest, ctx: Ctx, caller: Caller
) -> JoinSamplingSessionResponse:
    counter = await asyncio.to_thread(ctx.samplers.join, caller.owner, body.sampling_session_id)
    return JoinSamplingSessionResponse(client_counter=counter)


@router.post("/asample")
async def asample(body: SampleRequestJson, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    if body.sampling_session_id is None or body.seq_id is None:
        raise UserError("asample needs a sampling_session_id and a seq_id (create a sampling client first)")
    request = sample_request_to_domain(body)
    future, sequence_ids = await ctx.sampling.sample(caller.owner, body.sampling_session_id, body.seq_id, request)
    return UntypedAPIFuture(request_id=future.request_id, sample_sequence_ids=sequence_ids)
