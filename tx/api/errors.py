"""The one place where domain errors become HTTP statuses, and where the spec documents them.

Every error answers with a JSON body `{"detail": ...}`: a message, or for 422 a list of
`{loc, msg, type}`. Text quoted from a request is escaped if it cannot be encoded (a lone surrogate).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from tx.disconnect import answer_disconnects
from tx.store.store import SessionFinishedError
from tx.types import ConflictError, NotFoundError, OverloadedError, QuotaExceededError, UserError

STATUS_OF: dict[type[Exception], int] = {
    UserError: 400,
    NotFoundError: 404,
    ConflictError: 409,
    SessionFinishedError: 410,
    OverloadedError: 429,
}

_MEANING = {
    400: "bad input (a user error); not retried",
    401: "missing or invalid X-API-Key",
    403: "the key may not use this route (operator routes need an operator key), or one of its quotas is full "
         "(the detail names it and the setting that raises it)",
    404: "no such resource, or not the caller's",
    409: "conflicts with the current state",
    410: "the session is finished",
    413: "request body over the route's size limit",
    422: "the body or query does not match the schema",
    429: "too much queued work (the server's, or the key's own quota: the detail says which); retry after "
         "Retry-After seconds",
}


class ErrorBody(BaseModel):
    detail: str | list[dict[str, Any]]


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these statuses, each with the JSON error body."""
    return {code: {"model": ErrorBody, "description": _MEANING[code]} for code in codes}


# Every route with a body or a key can answer these (400: a body that is not JSON at all; 403 and 429: a quota
# of the key, see tx/core/quotas.py); routers add the ones their use cases raise.
COMMON_ERRORS = error_responses(400, 401, 403, 413, 422, 429)

InvalidHook = Callable[[Request, Any], Awaitable[None]]


def install_error_handlers(app: FastAPI, on_invalid: InvalidHook | None = None) -> None:
    """`on_invalid(request, body)` runs before a 422 is answered (e.g. to release a sequenced seq_id)."""

    def handler(status: int):
        async def handle(request: Request, exc: Exception) -> JSONResponse:
            headers = {"Retry-After": "1"} if status == 429 else None
            return JSONResponse(_body(request, safe_text(str(exc)), status), status_code=status, headers=headers)

        return handle

    for error, status in STATUS_OF.items():
        app.add_exception_handler(error, handler(status))

    async def quota(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, QuotaExceededError)
        status = 429 if exc.transient else 403
        headers = {"Retry-After": "1"} if exc.transient else None
        return JSONResponse(_body(request, safe_text(str(exc)), status), status_code=status, headers=headers)

    app.add_exception_handler(QuotaExceededError, quota)
    answer_disconnects(app)

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        if on_invalid is not None:
            with contextlib.suppress(Exception):  # e.g. no valid key: then no queue may move
                await on_invalid(request, exc.body)
        errors = [
            {"loc": [safe_text(x) if isinstance(x, str) else x for x in e.get("loc", ())],
             "msg": safe_text(e.get("msg", "")), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        return JSONResponse(_body(request, errors, 422), status_code=422)

    app.add_exception_handler(RequestValidationError, invalid)


def safe_text(message: str) -> str:
    """A message safe to encode: user text it quotes may hold a lone surrogate."""
    return message.encode("utf-8", "backslashreplace").decode("utf-8")


def _body(request: Request, detail: str | list[dict[str, Any]], status: int) -> dict[str, Any]:
    """{"detail": ...}; under /oai/ (the OpenAI-compatible routes) also OpenAI's {"error": {message, type, code}}."""
    if not request.url.path.startswith("/oai/"):
        return {"detail": detail}
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"detail": detail, "error": {"message": str(detail), "type": kind, "code": status}}
