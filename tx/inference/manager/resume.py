"""The abort/resume policy: how a sample that a pause cut short still reaches its caller whole.

The whole story, in one place:
- Who aborts: the lifecycle, when a colocated training pass takes the accelerator and samples are still
  running after `training_wait_s` (`lifecycle.py`: it sleeps the engines with mode `abort`).
- What comes back: each cut sequence ends with stop reason `abort`, holding its tokens and logprobs so far.
- What tx does (`complete`, here): before each round of resends it waits until the engines may run again
  (`wait`: the lifecycle's `resume_after_training`), then resends each cut sequence alone (`n = 1`) with its
  tokens so far appended to the prompt and `max_tokens` reduced by as many, until it ends, at most
  `MAX_ABORT_ROUNDS` times. A seeded resend after k tokens uses `seed + index + k * n`: a stream of its own
  (sample j of the request uses `seed + j`, and two samples cut after the same k must not share one), and the
  same one for the same cut. Prompt logprobs (and target logprobs, alternative tokens) are never asked
  again: the first answer has them; the top-k of each sampled token is asked again, for the new tokens.
- What engines do (the contract's `GenerateRequest.resumed_tokens`, `tx/inference/engines/stops.py`): a stop
  string may start in the resent tokens' text and end in the new text; engines match it there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tx.inference.protocol import GeneratedSequence, GenerateRequest, GenerateResponse

MAX_ABORT_ROUNDS = 64

Send = Callable[[GenerateRequest], Awaitable[GenerateResponse]]  # one generate call to the same engine
Wait = Callable[[], Awaitable[None]]


class StillAborted(RuntimeError):
    """A sequence was still cut short after `MAX_ABORT_ROUNDS` resends."""


async def complete(send: Send, request: GenerateRequest, first: GenerateResponse,
                   wait: Wait | None = None) -> GenerateResponse:
    """`first` with each aborted sequence resent until it ends. The waits of one request run one at a time
    (the first aborted sequence does the waiting; the others find the engines ready)."""
    if not any(seq.stop_reason == "abort" for seq in first.sequences):
        return first
    lock = asyncio.Lock()

    async def ready() -> None:
        if wait is not None:
            async with lock:
                await wait()

    sequences = await asyncio.gather(*(
        _resend_until_done(send, request, index, seq, ready) if seq.stop_reason == "abort" else _as_is(seq)
        for index, seq in enumerate(first.sequences)
    ))
    return first.model_copy(update={"sequences": list(sequences)})


async def _resend_until_done(send: Send, request: GenerateRequest, index: int, partial: GeneratedSequence,
                             ready: Wait) -> GeneratedSequence:
    tokens, logprobs = list(partial.token_ids), list(partial.logprobs)
    topk = None if partial.topk_logprobs is None else list(partial.topk_logprobs)
    for _ in range(MAX_ABORT_ROUNDS):
        await ready()
        remaining = request.max_tokens - len(tokens)
        if remaining <= 0:
            return GeneratedSequence(token_ids=tokens, logprobs=logprobs, stop_reason="length", topk_logprobs=topk)
        piece = (await send(resend_request(request, index, tokens, remaining))).sequences[0]
        tokens += piece.token_ids
        logprobs += piece.logprobs
        if topk is not None:
            topk += piece.topk_logprobs or []
        if piece.stop_reason != "abort":
            return GeneratedSequence(token_ids=tokens, logprobs=logprobs, stop_reason=piece.stop_reason,
                                     topk_logprobs=topk)
    raise StillAborted(f"request still aborted after {MAX_ABORT_ROUNDS} resends")


def resend_request(request: GenerateRequest, index: int, tokens: list[int], remaining: int) -> GenerateRequest:
    """Sample `index` of `request` again, after the `tokens` it already generated."""
    return request.model_copy(update={
        "prompt_token_ids": request.prompt_token_ids + tokens, "n": 1, "max_tokens": remaining,
        "prompt_logprobs": False, "topk_prompt_logprobs": 0, "prompt_logprobs_last_n": None,
        "target_token_ids": None, "prompt_alt_tokens_k": 0,
        "seed": None if request.seed is None else request.seed + index + len(tokens) * request.n,
        "resumed_tokens": request.resumed_tokens + len(tokens),
    })


async def _as_is(sequence: GeneratedSequence) -> GeneratedSequence:
    return sequence
