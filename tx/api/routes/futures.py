"""Futures: retrieve_future (a long-poll: the result, a failure, or try_again), retrieve_futures
(the batch long-poll of one sampling session's completions) and cancel_future."""

from __future__ import annotations

import asyncio
from functools import singledispatch

from fastapi import APIRouter, Response
from pydantic import BaseModel

from tx.api.deps import Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.wire.codec import PROTOBUF_CONTENT_TYPE, encode_forward_backward_output, encode_sample_response
from tx.api.wire.schemas.checkpoints import (
    LoadWeightsResponse,
    SaveWeightsExternalResponse,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
)
from tx.api.wire.schemas.custom_losses import CreateCustomLossResponse
from tx.api.wire.schemas.futures import (
    CancelFutureRequest,
    FutureCompletion,
    FuturesRetrieveRequest,
    FuturesRetrieveResponse,
    RequestFailedResponse,
    RetrieveFutureRequest,
    TryAgainResponse,
)
from tx.api.wire.schemas.models import CreateModelResponse, OptimStepResponse
from tx.core.results import (
    CheckpointSaved,
    CustomLossCreated,
    ExternalSaved,
    ModelCreated,
    SamplerSaved,
    WeightsLoaded,
)
from tx.types import ForwardBackwardResult, OptimStepResult, SampleResult

router = APIRouter(tags=["futures"], responses=COMMON_ERRORS | error_responses(404, 409))


@router.post("/retrieve_future")
async def retrieve_future(body: RetrieveFutureRequest, ctx: Ctx, caller: Caller) -> Response:
    future = await ctx.futures.wait(body.request_id, caller.owner, ctx.settings.long_poll_s)
    if not future.done:
        return _json(TryAgainResponse(request_id=future.request_id, queue_state=future.queue_state,
                                      queue_state_reason=future.queue_state_reason))
    if future.failure is not None:
        return _json(RequestFailedResponse(error=future.failure.message, category=future.failure.category))
    return encode_result(future.result)


@router.post("/retrieve_futures")
async def retrieve_futures(body: FuturesRetrieveRequest, ctx: Ctx, caller: Caller) -> FuturesRetrieveResponse:
    target = body.target
    await asyncio.to_thread(ctx.samplers.describe, caller.owner, target.sampling_session_id)  # 404 unless owned
    ctx.futures.forget(body.retrieved_request_ids, caller.owner)
    timeout = ctx.settings.long_poll_s if body.timeout is None else min(body.timeout, ctx.settings.long_poll_s)
    events, cursor = await ctx.futures.feeds.poll(
        (target.sampling_session_id, target.cloned_sampler_id), body.prev_cursor, timeout
    )
    completions = [FutureCompletion(state="failed" if e.failed else "finished", request_id=e.request_id)
                   for e in events]
    return FuturesRetrieveResponse(completions=completions, cursor=cursor)


@router.post("/cancel_future")
async def cancel_future(body: CancelFutureRequest, ctx: Ctx, caller: Caller) -> dict:
    ctx.sampling.cancel(caller.owner, body.request_id)
    return {"request_id": body.request_id, "cancelled": True}


def _json(model: BaseModel) -> Response:
    return Response(model.model_dump_json(exclude_none=True), media_type="application/json")


@singledispatch
def encode_result(result: object) -> Response:
    raise TypeError(f"no wire encoding for result type {type(result).__name__}")


@encode_result.register
def _(result: ForwardBackwardResult) -> Response:
    return Response(encode_forward_backward_output(result), media_type=PROTOBUF_CONTENT_TYPE)


@encode_result.register
def _(result: SampleResult) -> Response:
    return Response(encode_sample_response(result), media_type=PROTOBUF_CONTENT_TYPE)


@encode_result.register
def _(result: ModelCreated) -> Response:
    return _json(CreateModelResponse(model_id=result.model_id))


@encode_result.register
def _(result: OptimStepResult) -> Response:
    return _json(OptimStepResponse(metrics=result.metrics))


@encode_result.register
def _(result: CheckpointSaved) -> Response:
    return _json(SaveWeightsResponse(path=result.path))


@encode_result.register
def _(result: SamplerSaved) -> Response:
    return _json(SaveWeightsForSamplerResponse(path=result.path, sampling_session_id=result.sampling_session_id))


@encode_result.register
def _(result: ExternalSaved) -> Response:
    return _json(SaveWeightsExternalResponse(path=result.path, size_bytes=result.size_bytes))


@encode_result.register
def _(result: WeightsLoaded) -> Response:
    return _json(LoadWeightsResponse(path=result.path, model_id=result.model_id))


@encode_result.register
def _(result: CustomLossCreated) -> Response:
    return _json(CreateCustomLossResponse(loss_id=result.loss_id))
