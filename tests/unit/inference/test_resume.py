"""The abort/resume policy (tx/inference/manager/resume.py) over a scripted engine: what a resend asks for, and
that a caller gets one whole answer (or a clear error when the engine keeps aborting)."""

from __future__ import annotations

import asyncio

import pytest

from tx.inference.manager.resume import MAX_ABORT_ROUNDS, StillAborted, complete
from tx.inference.protocol import GeneratedSequence, GenerateRequest, GenerateResponse, StopReasonName


def _seq(tokens: list[int], reason: StopReasonName) -> GeneratedSequence:
    return GeneratedSequence(token_ids=tokens, logprobs=[-0.5] * len(tokens), stop_reason=reason)


def test_aborted_samples_are_resent_after_the_wait_with_their_own_seeds() -> None:
    request = GenerateRequest(prompt_token_ids=[1, 2], n=2, max_tokens=5, seed=10, prompt_logprobs=True,
                              stop_strings=["x"])
    first = GenerateResponse(sequences=[_seq([7, 8], "abort"), _seq([9], "stop")], prompt_logprobs=[None, -1.0])
    sent: list[GenerateRequest] = []
    waits: list[int] = []

    async def send(body: GenerateRequest) -> GenerateResponse:
        sent.append(body)
        return GenerateResponse(sequences=[_seq([3, 4, 5], "length")])

    async def wait() -> None:
        waits.append(len(sent))

    answer = asyncio.run(complete(send, request, first, wait))
    (resend,) = sent
    assert resend.prompt_token_ids == [1, 2, 7, 8] and resend.n == 1 and resend.max_tokens == 3
    assert resend.seed == 10 + 0 + 2 * 2 and resend.resumed_tokens == 2  # seed + index + k * n
    assert not resend.prompt_logprobs and resend.stop_strings == ["x"]
    assert waits == [0]  # waited before resending
    assert [s.token_ids for s in answer.sequences] == [[7, 8, 3, 4, 5], [9]]
    assert answer.sequences[0].stop_reason == "length" and answer.prompt_logprobs == [None, -1.0]


def test_an_engine_that_keeps_aborting_ends_in_a_clear_error() -> None:
    request = GenerateRequest(prompt_token_ids=[1], max_tokens=10_000)

    async def send(body: GenerateRequest) -> GenerateResponse:
        return GenerateResponse(sequences=[_seq([2], "abort")])

    first = GenerateResponse(sequences=[_seq([], "abort")])
    with pytest.raises(StillAborted, match=str(MAX_ABORT_ROUNDS)):
        asyncio.run(complete(send, request, first))
