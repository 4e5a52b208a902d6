"""`BatchGate`: requests share vLLM's batch, or one runs alone in it (see `translate.py`: LoRA + prompt
logprobs); waiting exclusive requests go first. `all_or_none`: the calls of one request to vLLM, none left running
once one failed. `record_answer`: the stats of vLLM's answers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from tx.inference.protocol import EngineStats, GenerateRequest, GenerateResponse

T = TypeVar("T")


async def all_or_none(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Each call's answer, in order. The first that raises cancels the others (closing their connections makes
    vLLM abort their requests: nothing runs on for an answer no one reads) and its error is raised."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class BatchGate:
    """Shared use of vLLM's batch, or exclusive (no other request in flight); waiting exclusives go first."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextlib.asynccontextmanager
    async def shared(self):
        async with self._cond:
            await self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            async with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self):
        async with self._cond:
            self._waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            async with self._cond:
                self._exclusive = False
                self._cond.notify_all()

    async def complete(self, bodies: list[dict], complete: Callable[[dict], Awaitable[Any]],
                       first_alone: bool = False) -> list[Any]:
        """Each body's answer, in order: the first alone in vLLM's batch if asked, the others shared."""
        answers = []
        if first_alone:
            async with self.exclusive():
                answers.append(await complete(bodies[0]))
            bodies = bodies[1:]
        async with self.shared():
            answers += await all_or_none(complete(body) for body in bodies)
        return answers


def record_answer(stats: EngineStats, request: GenerateRequest, response: GenerateResponse) -> None:
    """Count an answered request (vLLM batches it with others; one request is what tx sees)."""
    stats.num_requests += 1
    stats.num_batches += 1
    stats.num_generated_tokens += sum(len(s.token_ids) for s in response.sequences)
    stats.max_requests_per_batch = max(stats.max_requests_per_batch, 1)
    stats.max_rows_per_step = max(stats.max_rows_per_step, request.n)
