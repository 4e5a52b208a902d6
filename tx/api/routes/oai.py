"""OpenAI-compatible inference (/oai/api/v1): models, completions and chat completions, with SSE streaming.

The model is a served base model or a `tinker://.../sampler_weights/...` path; the same API keys as the
Tinker routes (as `Authorization: Bearer`), the same engines (`tx.core.sampling.text`). Streaming sends
each choice's text token by token once its sample is done (the engines answer whole samples).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from tx.api.deps import Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.wire.schemas.oai import ChatCompletionRequest, CompletionRequest
from tx.core.sampling.text import TextChoice, TextResult
from tx.types import SamplingParams

router = APIRouter(tags=["openai"], responses=COMMON_ERRORS | error_responses(404, 429))
CHAT_DEFAULT_MAX_TOKENS = 512


@router.get("/models")
async def models(ctx: Ctx, _: Caller) -> dict:
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "tx"} for name in ctx.text.base_models()]
    return {"object": "list", "data": data}


@router.post("/completions", response_model=None)
async def completions(body: CompletionRequest, ctx: Ctx, caller: Caller) -> dict | StreamingResponse:
    body.refuse_unsupported()
    result = await ctx.text.complete(caller.owner, body.model, body.prompt, _params(body, body.max_tokens), body.n)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
    if body.stream:
        return _sse(_completion_chunks(head, result))
    choices = [
        {"index": i, "text": c.text, "finish_reason": c.finish_reason,
         "logprobs": _completion_logprobs(c) if body.logprobs is not None else None}
        for i, c in enumerate(result.choices)
    ]
    return {**head, "object": "text_completion", "choices": choices, "usage": _usage(result)}


@router.post("/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, ctx: Ctx, caller: Caller) -> dict | StreamingResponse:
    body.refuse_unsupported()
    messages = [{"role": m.role if m.role != "developer" else "system", "content": m.text()} for m in body.messages]
    params = _params(body, body.max_new_tokens(CHAT_DEFAULT_MAX_TOKENS))
    result = await ctx.text.chat(caller.owner, body.model, messages, params, body.n)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
    if body.stream:
        return _sse(_chat_chunks(head, result))
    choices = [
        {"index": i, "message": {"role": "assistant", "content": c.text}, "finish_reason": c.finish_reason,
         "logprobs": _chat_logprobs(c) if body.logprobs else None}
        for i, c in enumerate(result.choices)
    ]
    return {**head, "object": "chat.completion", "choices": choices, "usage": _usage(result)}


def _params(body: CompletionRequest | ChatCompletionRequest, max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, seed=body.seed,
                          stop_strings=body.stop_strings())


def _usage(result: TextResult) -> dict:
    total = result.prompt_tokens + result.completion_tokens
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens, "total_tokens": total}


def _completion_logprobs(choice: TextChoice) -> dict:
    kept = _kept(choice)
    offsets = list(itertools.accumulate((len(p) for p in choice.pieces[:kept]), initial=0))[:kept]
    return {"tokens": choice.pieces[:kept], "token_logprobs": choice.logprobs[:kept], "top_logprobs": None,
            "text_offset": offsets}


def _chat_logprobs(choice: TextChoice) -> dict:
    kept = _kept(choice)
    content = [{"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []}
               for piece, lp in zip(choice.pieces[:kept], choice.logprobs[:kept])]
    return {"content": content}


def _kept(choice: TextChoice) -> int:
    """How many tokens make the returned text (a stop string cuts the tail off)."""
    total = 0
    for i, piece in enumerate(choice.pieces):
        total += len(piece)
        if total >= len(choice.text):
            return i + 1
    return len(choice.pieces)


def _completion_chunks(head: dict, result: TextResult) -> Iterator[dict]:
    chunk = {**head, "object": "text_completion"}
    for i, choice in enumerate(result.choices):
        for piece in choice.pieces:
            if piece:
                yield {**chunk, "choices": [{"index": i, "text": piece, "finish_reason": None, "logprobs": None}]}
        yield {**chunk, "choices": [{"index": i, "text": "", "finish_reason": choice.finish_reason, "logprobs": None}]}


def _chat_chunks(head: dict, result: TextResult) -> Iterator[dict]:
    chunk = {**head, "object": "chat.completion.chunk"}
    for i, choice in enumerate(result.choices):
        yield {**chunk, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        for piece in choice.pieces:
            if piece:
                yield {**chunk, "choices": [{"index": i, "delta": {"content": piece}, "finish_reason": None}]}
        yield {**chunk, "choices": [{"index": i, "delta": {}, "finish_reason": choice.finish_reason}]}


def _sse(chunks: Iterator[dict[str, Any]]) -> StreamingResponse:
    def events() -> Iterator[str]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
