"""Training: create_model, get_info, forward_backward (protobuf), optim_step, save and load."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from tx.api.deps import Caller, Ctx
from tx.api.wire.codec import decode_forward_backward_request
from tx.api.wire.convert import (
    check_optimizer_config,
    lora_config_to_domain,
    optim_step_params_to_domain,
)
from tx.api.wire.schemas import (
    CreateModelRequest,
    GetInfoRequest,
    GetInfoResponse,
    LoadWeightsRequest,
    ModelData,
    OptimStepRequest,
    SaveWeightsForSamplerRequest,
    SaveWeightsRequest,
    UntypedAPIFuture,
)
from tx.core.futures import Future
from tx.models.serve import tokenizer_id_for
from tx.types import UserError

router = APIRouter(tags=["training"])


def _answer(future: Future, model_id: str | None) -> UntypedAPIFuture:
    return UntypedAPIFuture(request_id=future.request_id, model_id=model_id)


@router.post("/create_model")
async def create_model(body: CreateModelRequest, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    check_optimizer_config(body.optimizer_config)
    lora = lora_config_to_domain(body.lora_config)
    future = await asyncio.to_thread(
        ctx.service.create_model, caller.owner, body.session_id, body.model_seq_id, body.base_model,
        lora, body.user_metadata,
    )
    return _answer(future, f"{body.session_id}:train:{body.model_seq_id}")


@router.post("/get_info")
async def get_info(body: GetInfoRequest, ctx: Ctx, caller: Caller) -> GetInfoResponse:
    run, info = await asyncio.to_thread(ctx.service.model_info, caller.owner, body.model_id)
    directory = ctx.models[run.base_model]
    return GetInfoResponse(
        model_id=run.run_id,
        model_data=ModelData(
            arch=info.arch, model_name=run.base_model,
            tokenizer_id=tokenizer_id_for(run.base_model, directory),
        ),
        is_lora=True,
        lora_rank=run.lora_rank,
        model_name=run.base_model,
    )


@router.post("/forward_backward")
async def forward_backward(request: Request, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    body = await _read_body(request, ctx.settings.max_request_bytes)
    model_id, seq_id, batch = await asyncio.to_thread(
        decode_forward_backward_request, body, request.headers.get("content-encoding"),
        zstd_enabled=ctx.settings.proto_compress_fwdbwd,
    )
    future = await asyncio.to_thread(ctx.service.forward_backward, caller.owner, model_id, seq_id, batch)
    return _answer(future, model_id)


async def _read_body(request: Request, limit: int) -> bytes:
    content_type = request.headers.get("content-type", "")
    if "application/x-protobuf" not in content_type:
        raise UserError(
            f"forward_backward takes a protobuf body (Content-Type: application/x-protobuf), got {content_type!r}"
        )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise UserError(f"request body of {declared} bytes is over the {limit}-byte limit")
    body = await request.body()
    if len(body) > limit:
        raise UserError(f"request body of {len(body)} bytes is over the {limit}-byte limit")
    return body


@router.post("/optim_step")
async def optim_step(body: OptimStepRequest, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    adam = optim_step_params_to_domain(body)
    future = await asyncio.to_thread(
        ctx.service.optim_step, caller.owner, body.model_id, _seq(body.seq_id), adam
    )
    return _answer(future, body.model_id)


@router.post("/save_weights")
async def save_weights(body: SaveWeightsRequest, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    if not body.path:
        raise UserError("save_weights needs a checkpoint name in 'path'")
    future = await asyncio.to_thread(
        ctx.service.save_weights, caller.owner, body.model_id, _seq(body.seq_id), body.path,
        body.ttl_seconds, body.overwrite, body.user_metadata,
    )
    return _answer(future, body.model_id)


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(
    body: SaveWeightsForSamplerRequest, ctx: Ctx, caller: Caller
) -> UntypedAPIFuture:
    future = await asyncio.to_thread(
        ctx.service.save_weights_for_sampler, caller.owner, body.model_id, _seq(body.seq_id), body.path,
        body.sampling_session_seq_id, body.ttl_seconds, body.user_metadata,
    )
    return _answer(future, body.model_id)


@router.post("/load_weights")
async def load_weights(body: LoadWeightsRequest, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    if body.is_create_via_load:
        if body.optimizer_config is not None:
            check_optimizer_config(body.optimizer_config)
        future = await asyncio.to_thread(
            ctx.service.load_into_new_model, caller.owner, body.session_id, body.model_seq_id,
            body.path, body.optimizer,
        )
        return _answer(future, f"{body.session_id}:train:{body.model_seq_id}")
    future = await asyncio.to_thread(
        ctx.service.load_state, caller.owner, body.model_id, _seq(body.seq_id), body.path, body.optimizer
    )
    return _answer(future, body.model_id)


def _seq(seq_id: int | None) -> int:
    if seq_id is None:
        raise UserError("this request needs a seq_id (>= 1)")
    return seq_id
