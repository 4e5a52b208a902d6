"""A request whose HTTP client went away stops its work: `until_disconnected` awaits the work while it watches the
connection, and cancels the work the moment the client disconnects (docs/engines.md#generate: an abandoned
request is aborted, not generated to completion). Streaming responses need no watch: Starlette cancels their body
generator on a disconnect, and each generator cancels its work in its `finally`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import FastAPI, Request, Response
from starlette.requests import ClientDisconnect

T = TypeVar("T")


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result; raises `ClientDisconnect` (after cancelling `work`) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()  # the client went away (or this handler was cancelled)
    if task.cancelled():
        raise ClientDisconnect()
    return task.result()


def answer_disconnects(app: FastAPI) -> None:
    """`ClientDisconnect` answers 499 (nobody reads it) rather than reaching the 500 handler as a server error."""

    async def gone(request: Request, exc: Exception) -> Response:
        return Response(status_code=499)

    app.add_exception_handler(ClientDisconnect, gone)


async def _disconnect(request: Request) -> None:
    """Returns once the client disconnected (the body was read already: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


__all__ = ["answer_disconnects", "until_disconnected"]
