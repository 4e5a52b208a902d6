"""Training: create_model, get_info, forward_backward (protobuf), optim_step, save and load."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from tx.api.context import Context
from tx.api.deps import Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.sequencing import require_seq, uses_seq, uses_seq_in_thread
from tx.api.wire.codec import (
    PROTOBUF_CONTENT_TYPE,
    forward_backward_input_from_proto,
    parse_forward_backward_request,
)
from tx.api.wire.convert import (
    lora_config_to_domain,
    optim_step_params_to_domain,
    optimizer_config_to_domain,
    optimizer_config_to_wire,
)
from tx.api.wire.schemas.checkpoints import (
    LoadWeightsRequest,
    SaveWeightsExternalRequest,
    SaveWeightsForSamplerRequest,
    SaveWeightsRequest,
)
from tx.api.wire.schemas.futures import UntypedAPIFuture
from tx.api.wire.schemas.models import (
    CreateModelRequest,
    GetInfoRequest,
    GetInfoResponse,
    ModelData,
    OptimStepRequest,
)
from tx.core.futures import Future
from tx.types import UserError, model_id_for

router = APIRouter(tags=["training"], responses=COMMON_ERRORS | error_responses(404, 409))


def _answer(future: Future, model_id: str | None) -> UntypedAPIFuture:
    return UntypedAPIFuture(request_id=future.request_id, model_id=model_id)


@router.post("/create_model")
async def create_model(body: CreateModelRequest, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    optimizer = optimizer_config_to_domain(body.optimizer_config)
    lora = lora_config_to_domain(body.lora_config)
    future = await asyncio.to_thread(
        ctx.runs.create, caller.owner, body.session_id, body.model_seq_id, body.base_model,
        lora, body.user_metadata, optimizer,
    )
    return _answer(future, model_id_for(body.session_id, body.model_seq_id))


@router.post("/get_info")
async def get_info(body: GetInfoRequest, ctx: Ctx, caller: Caller) -> GetInfoResponse:
    info = await asyncio.to_thread(ctx.views.model_info, caller.owner, body.model_id)
    run = info.run
    return GetInfoResponse(
        model_id=run.run_id,
        model_data=ModelData(arch=info.base.arch, model_name=run.base_model, tokenizer_id=info.tokenizer_id),
        is_lora=True,
        lora_rank=run.lora.rank,
        model_name=run.base_model,
        optimizer_config=optimizer_config_to_wire(run.optimizer),
    )


_PROTOBUF_BODY = {"requestBody": {"required": True, "content": {
    PROTOBUF_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary",
                                          "description": "a tinker ForwardBackwardRequest message"}},
}}}


@router.post("/forward_backward", openapi_extra=_PROTOBUF_BODY)
async def forward_backward(request: Request, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    body = await _read_body(request)
    encoding = request.headers.get("content-encoding")
    return await asyncio.to_thread(_submit_forward_backward, ctx, caller.owner, body, encoding)


def _submit_forward_backward(ctx: Context, owner: str, body: bytes, encoding: str | None) -> UntypedAPIFuture:
    """Decode, check and queue a forward_backward in one worker thread: each hop off the event loop and back
    waits for a thread to be scheduled, which on a busy CPU box is milliseconds of the step."""
    msg = parse_forward_backward_request(body, encoding, zstd_enabled=ctx.settings.proto_compress_fwdbwd)
    with uses_seq_in_thread(ctx, owner, msg.model_id, msg.seq_id):
        batch = forward_backward_input_from_proto(msg)
        future = ctx.training.forward_backward(owner, msg.model_id, msg.seq_id, batch)
    return _answer(future, msg.model_id)


async def _read_body(request: Request) -> bytes:
    """The protobuf body (its size is capped by `tx.api.limits.BodyLimit`)."""
    content_type = request.headers.get("content-type", "")
    if PROTOBUF_CONTENT_TYPE not in content_type:
        raise UserError(
            f"forward_backward takes a protobuf body (Content-Type: application/x-protobuf), got {content_type!r}"
        )
    return await request.body()


@router.post("/optim_step")
async def optim_step(body: OptimStepRequest, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    seq_id = require_seq(body.seq_id)
    async with uses_seq(ctx, caller.owner, body.model_id, seq_id):
        params = optim_step_params_to_domain(body)
        if ctx.sequencer.queues_in_memory(body.model_id):  # no store read or write: queued here, no thread hop
            future = ctx.training.optim_step(caller.owner, body.model_id, seq_id, params)
        else:
            future = await asyncio.to_thread(ctx.training.optim_step, caller.owner, body.model_id, seq_id, params)
    return _answer(future, body.model_id)


@router.post("/save_weights")
async def save_weights(body: SaveWeightsRequest, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    seq_id = require_seq(body.seq_id)
    async with uses_seq(ctx, caller.owner, body.model_id, seq_id):
        if not body.path:
            raise UserError("save_weights needs a checkpoint name in 'path'")
        future = await asyncio.to_thread(
            ctx.checkpoints.save_weights, caller.owner, body.model_id, seq_id, body.path,
            body.ttl_seconds, body.overwrite, body.user_metadata,
        )
    return _answer(future, body.model_id)


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(
    body: SaveWeightsForSamplerRequest, ctx: Ctx, caller: Caller
) -> UntypedAPIFuture:
    seq_id = require_seq(body.seq_id)
    async with uses_seq(ctx, caller.owner, body.model_id, seq_id):
        future = await asyncio.to_thread(
            ctx.checkpoints.save_weights_for_sampler, caller.owner, body.model_id, seq_id, body.path,
            body.sampling_session_seq_id, body.ttl_seconds, body.user_metadata, inflight=body.kind == "inflight",
        )
    return _answer(future, body.model_id)


@router.post("/save_weights_external")
async def save_weights_external(body: SaveWeightsExternalRequest, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    seq_id = require_seq(body.seq_id)
    async with uses_seq(ctx, caller.owner, body.model_id, seq_id):
        future = await asyncio.to_thread(
            ctx.checkpoints.save_weights_external, caller.owner, body.model_id, seq_id, body.path,
            body.ttl_seconds, body.age_encryption_recipients,
        )
    return _answer(future, body.model_id)


@router.post("/load_weights")
async def load_weights(body: LoadWeightsRequest, ctx: Ctx, caller: Caller) -> UntypedAPIFuture:
    if body.is_create_via_load:
        assert body.session_id is not None and body.model_seq_id is not None  # LoadWeightsRequest checked it
        optimizer = optimizer_config_to_domain(body.optimizer_config) if body.optimizer_config else None
        future = await asyncio.to_thread(
            ctx.runs.create_from_checkpoint, caller.owner, body.session_id, body.model_seq_id,
            body.path, body.optimizer, optimizer,
        )
        return _answer(future, model_id_for(body.session_id, body.model_seq_id))
    assert body.model_id is not None  # LoadWeightsRequest checked it: one of the two forms
    seq_id = require_seq(body.seq_id)
    async with uses_seq(ctx, caller.owner, body.model_id, seq_id):
        future = await asyncio.to_thread(
            ctx.training.load_state, caller.owner, body.model_id, seq_id, body.path, body.optimizer
        )
    return _answer(future, body.model_id)
