"""Request body limits, enforced before a route or a JSON parser sees the body.

Routes that carry data (forward_backward batches, asample prompts with images, imported adapters) take bodies up to
`max_request_bytes`; every other route takes JSON of at most `max_json_bytes`. A declared
Content-Length over the limit is refused at once; a body streamed without one is counted as it
arrives. Either way the answer is a 413 with a JSON `detail`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import HTTPException
from starlette.responses import JSONResponse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DATA_ROUTES = ("/api/v1/forward_backward", "/api/v1/asample", "/api/v1/tx/checkpoints/import")


class BodyLimit:
    """ASGI middleware: a 413 for a body over its route's limit."""

    def __init__(self, app: ASGIApp, max_json_bytes: int, max_request_bytes: int) -> None:
        self.app = app
        self.max_json_bytes = max_json_bytes
        self.max_request_bytes = max_request_bytes

    def limit_for(self, path: str) -> int:
        return self.max_request_bytes if path.rstrip("/") in DATA_ROUTES else self.max_json_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await too_large(int(declared), limit)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise HTTPException(413, f"request body is over the {limit}-byte limit of this route")
            return message

        await self.app(scope, counted, send)


def too_large(size: int, limit: int) -> JSONResponse:
    return JSONResponse({"detail": f"request body of {size} bytes is over the {limit}-byte limit of this route"},
                        status_code=413)
