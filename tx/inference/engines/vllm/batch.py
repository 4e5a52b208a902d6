"""`BatchGate`: requests share vLLM's batch, or one runs alone in it (see `translate.py`: LoRA + prompt
logprobs); waiting exclusive requests go first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any


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
            answers += await asyncio.gather(*(complete(body) for body in bodies))
        return answers
