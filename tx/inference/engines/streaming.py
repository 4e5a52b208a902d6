"""The stream route's engine side (docs/engines.md#generate): tokens a backend hears as they are sampled, turned
into `GenerateEvent` lines; a backend that answers whole samples only streams its answer as one event.

Design / who owns what:
- `TokenStream` is made on the event loop; its `listener` is called from the engine's scheduler thread, one call
  per sampled token, and hands each token to the loop. `finish_with(future)` ends the stream with the request's
  answer (or its error) once the future is done.
- `events` coalesces the tokens that arrived since the last line into one event, so a slow reader gets fewer,
  larger lines instead of falling behind.
- `ndjson` writes the events as the route's body; an error after the first line is an event too (the status
  line is sent already).
- A reader that goes away closes `events` (Starlette cancels the body on a disconnect): the request's future is
  cancelled, which the scheduler takes as "abort this request" (`embedded/scheduler.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

from tx.inference.engines.http import detail_of, status_of
from tx.inference.protocol import GenerateResponse
from tx.inference.protocol.stream import GenerateEvent, TokenDelta

_END = None
Listener = Callable[[int, int, float], None]  # (sample index, token, raw logprob): `TokenStream.listener`


class TokenStream:
    """Tokens from the scheduler thread to the event loop, then the answer."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, int, float] | None] = asyncio.Queue()
        self._future: Future | asyncio.Future | None = None

    def listener(self, index: int, token: int, logprob: float) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (index, token, logprob))

    def finish_with(self, future: Future | asyncio.Future) -> None:
        """End the stream with `future`'s answer once it is done (after every token it heard)."""
        self._future = future
        future.add_done_callback(lambda _: self._loop.call_soon_threadsafe(self._queue.put_nowait, _END))

    async def events(self) -> AsyncIterator[GenerateEvent]:
        assert self._future is not None, "finish_with was not called"
        try:
            async for event in self._deltas():
                yield event
        finally:
            self._future.cancel()  # a no-op once answered; else the reader went away: abort the request
        try:
            yield GenerateEvent(result=self._future.result())
        except Exception as exc:  # noqa: BLE001 - the error policy's status, as an event
            yield GenerateEvent(error_status=status_of(exc), error_detail=detail_of(exc))

    async def _deltas(self) -> AsyncIterator[GenerateEvent]:
        ended = False
        while not ended:
            items = [await self._queue.get()]
            while not self._queue.empty():
                items.append(self._queue.get_nowait())
            ended = items[-1] is _END
            deltas: dict[int, TokenDelta] = {}
            for item in items:
                if item is not None:
                    index, token, logprob = item
                    delta = deltas.setdefault(index, TokenDelta(index=index, token_ids=[], logprobs=[]))
                    delta.token_ids.append(token)
                    delta.logprobs.append(logprob)
            if deltas:
                yield GenerateEvent(deltas=list(deltas.values()))


async def whole(response: GenerateResponse) -> AsyncIterator[GenerateEvent]:
    """A whole answer as the stream's one event (a backend that cannot stream)."""
    yield GenerateEvent(result=response)


async def ndjson(events: AsyncIterator[GenerateEvent]) -> AsyncIterator[bytes]:
    async for event in events:
        yield event.model_dump_json(exclude_defaults=True).encode() + b"\n"
