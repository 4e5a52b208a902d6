"""OpenAI-compatible inference (/oai/api/v1): models, completions and chat completions, with SSE streaming.

The model is a served base model or a `tinker://.../sampler_weights/...` path; the same API keys as the
Tinker routes (as `Authorization: Bearer`), the same engines (`tx.core.sampling.text`). Streaming sends each
choice's text as the engine generates its tokens (`tx.core.sampling.text_stream`: nothing past a stop string is
ever sent); the response starts with the first token, so a request the engine refuses is still a 4xx. A client
that goes away (streaming or not) cancels its sample: the engine aborts it (`tx/disconnect.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from tx.api.deps import Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.wire.schemas.oai import ChatCompletionRequest, CompletionRequest
from tx.core.sampling.text import TextChoice, TextJob, TextResult, TextSampling
from tx.core.sampling.text_stream import TextStream
from tx.disconnect import until_disconnected
from tx.types import SamplingParams

router = APIRouter(tags=["openai"], responses=COMMON_ERRORS | error_responses(404, 429))
CHAT_DEFAULT_MAX_TOKENS = 512


@router.get("/models")
async def models(ctx: Ctx, _: Caller) -> dict:
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "tx"} for name in ctx.text.base_models()]
    return {"object": "list", "data": data}


@router.post("/completions", response_model=None)
async def completions(body: CompletionRequest, ctx: Ctx, caller: Caller, http: Request) -> dict | StreamingResponse:
    body.refuse_unsupported()
    job = await ctx.text.prepare_completion(caller.owner, body.model, body.prompt, _params(body, body.max_tokens),
                                            body.n, body.top_logprobs())
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
    if body.stream:
        return await _stream(ctx.text, job, {**head, "object": "text_completion"}, http, chat=False)
    result = await until_disconnected(http, ctx.text.run(job))
    choices = [
        {"index": i, "text": c.text, "finish_reason": c.finish_reason,
         "logprobs": _completion_logprobs(c) if body.logprobs is not None else None}
        for i, c in enumerate(result.choices)
    ]
    return {**head, "object": "text_completion", "choices": choices, "usage": _usage(result)}


@router.post("/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, ctx: Ctx, caller: Caller,
                           http: Request) -> dict | StreamingResponse:
    body.refuse_unsupported()
    messages = [{"role": m.role if m.role != "developer" else "system", "content": m.text()} for m in body.messages]
    params = _params(body, body.max_new_tokens(CHAT_DEFAULT_MAX_TOKENS))
    job = await ctx.text.prepare_chat(caller.owner, body.model, messages, params, body.n,
                                      body.alternatives() if body.logprobs else 0)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
    if body.stream:
        return await _stream(ctx.text, job, {**head, "object": "chat.completion.chunk"}, http, chat=True)
    result = await until_disconnected(http, ctx.text.run(job))
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
    top = [dict(alternatives) for alternatives in choice.top[:kept]] if choice.top else None
    return {"tokens": choice.pieces[:kept], "token_logprobs": choice.logprobs[:kept], "top_logprobs": top,
            "text_offset": offsets}


def _chat_logprobs(choice: TextChoice) -> dict:
    kept = _kept(choice)
    tops = choice.top[:kept] if choice.top else [[] for _ in range(kept)]
    content = [{"token": piece, "logprob": lp, "bytes": list(piece.encode()),
                "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top]}
               for piece, lp, top in zip(choice.pieces[:kept], choice.logprobs[:kept], tops)]
    return {"content": content}


def _kept(choice: TextChoice) -> int:
    """How many tokens make the returned text (a stop string cuts the tail off)."""
    total = 0
    for i, piece in enumerate(choice.pieces):
        total += len(piece)
        if total >= len(choice.text):
            return i + 1
    return len(choice.pieces)


async def _stream(text: TextSampling, job: TextJob, head: dict, http: Request, chat: bool) -> StreamingResponse:
    """Sample `job`, streaming each choice's text as server-sent events; waits for the first token (or the
    sample's error, answered by the error policy as any other) before the response starts."""
    queue: asyncio.Queue[tuple[int, list[int]] | None] = asyncio.Queue()
    task = asyncio.create_task(text.run(job, on_tokens=lambda i, tokens, _: queue.put_nowait((i, tokens))))
    task.add_done_callback(lambda _: queue.put_nowait(None))
    try:
        first = await until_disconnected(http, queue.get())
    except BaseException:  # the client went away before the first token (or this handler was cancelled)
        task.cancel()
        raise
    if first is None:
        task.result()  # raises the sample's error, if any, before anything is sent
    events = _events(text, job, head, chat, queue, task, first)
    return StreamingResponse(events, media_type="text/event-stream")


async def _events(text: TextSampling, job: TextJob, head: dict, chat: bool,
                  queue: asyncio.Queue[tuple[int, list[int]] | None], task: asyncio.Task[TextResult],
                  item: tuple[int, list[int]] | None) -> AsyncIterator[str]:
    streams = [TextStream(job.tokenizer, job.params.stop_strings) for _ in range(job.n)]
    try:
        if chat:
            for i in range(job.n):
                yield _sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                 "finish_reason": None}]})
        while item is not None:
            index, tokens = item
            if piece := await text.stream_text(job, streams[index], tokens):
                yield _sse(_piece(head, chat, index, piece))
            item = await queue.get()
        try:
            result = task.result()
        except Exception as exc:  # noqa: BLE001 - the status line is sent: the error goes in the stream
            yield _sse({"error": {"message": str(exc), "type": type(exc).__name__}})
            return
        for i, choice in enumerate(result.choices):
            if rest := streams[i].rest(choice.text):
                yield _sse(_piece(head, chat, i, rest))
            done = {"delta": {}} if chat else {"text": "", "logprobs": None}
            yield _sse({**head, "choices": [{"index": i, **done, "finish_reason": choice.finish_reason}]})
        yield "data: [DONE]\n\n"
    finally:
        task.cancel()  # a reader that went away stops waiting on the engine


def _piece(head: dict, chat: bool, index: int, text: str) -> dict:
    part = {"delta": {"content": text}} if chat else {"text": text, "logprobs": None}
    return {**head, "choices": [{"index": index, **part, "finish_reason": None}]}


def _sse(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps(chunk)}\n\n"
