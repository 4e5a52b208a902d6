"""What every engine's HTTP app shares: the cluster-secret guard and one error policy.

Errors map to the contract's statuses (`tx/inference/protocol/`): `UserError` 400, `NotFoundError` 404,
`ConflictError` 409, an `UpstreamError` (vLLM's error status) its own status, anything else 500; always a JSON
body `{"detail": ...}`, whose text names an unexpected error's type too (`detail_of`), so tx's caller learns the
cause of a failed step.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse

from tx.disconnect import answer_disconnects
from tx.inference.protocol import SECRET_HEADER
from tx.types import ConflictError, NotFoundError, UserError

ERROR_STATUS: dict[type[Exception], int] = {UserError: 400, NotFoundError: 404, ConflictError: 409}


class UpstreamError(RuntimeError):
    """A server behind the engine (vLLM) answered an error status; `status` is passed on to tx's caller."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def secret_guard(secret: str) -> list[Any]:
    """Route dependencies that refuse a request without the cluster secret (401; constant-time compare); async:
    a plain `def` dependency would cost a worker-thread hop per request."""
    expected = secret.encode()

    async def require_secret(value: Annotated[str | None, Header(alias=SECRET_HEADER)] = None) -> None:
        if value is None or not hmac.compare_digest(value.encode(), expected):
            raise HTTPException(status_code=401, detail=f"missing or wrong {SECRET_HEADER}")

    return [Depends(require_secret)]


def status_of(exc: Exception) -> int:
    """The status the error policy answers `exc` with."""
    if isinstance(exc, UpstreamError):
        return exc.status
    return next((status for error, status in ERROR_STATUS.items() if isinstance(exc, error)), 500)


def detail_of(exc: Exception) -> str:
    """The detail the error policy answers `exc` with: its message, after its type for an unexpected error (a step
    that failed: "RuntimeError: The size of tensor a ...")."""
    if isinstance(exc, (*ERROR_STATUS, UpstreamError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def add_error_handlers(app: FastAPI) -> None:
    """The error policy on `app`."""

    async def known(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=status_of(exc), content={"detail": str(exc)})

    for error in (*ERROR_STATUS, UpstreamError):
        app.add_exception_handler(error, known)

    async def internal(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=500, content={"detail": detail_of(exc)})

    app.add_exception_handler(Exception, internal)
    answer_disconnects(app)
