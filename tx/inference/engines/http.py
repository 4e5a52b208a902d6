"""What every engine's HTTP app shares: the cluster-secret guard and one error policy.

Errors map to the contract's statuses (`tx/inference/protocol.py`): `UserError` 400, `NotFoundError` 404,
`ConflictError` 409, anything else 500; always a JSON body `{"detail": ...}`.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import httpx
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse

from tx.inference.protocol import SECRET_HEADER
from tx.types import ConflictError, NotFoundError, UserError

ERROR_STATUS: dict[type[Exception], int] = {UserError: 400, NotFoundError: 404, ConflictError: 409}


def error_detail(response: httpx.Response) -> str:
    """The message of an engine's (or vLLM's) error response: `{"detail": ...}`, OpenAI's
    `{"error": {"message": ...}}`, or the raw text."""
    try:
        body = response.json()
    except ValueError:
        return response.text
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body))
        if isinstance(error, dict):
            return str(error.get("message", error))
        return str(error)
    return str(body)


def secret_guard(secret: str) -> list[Any]:
    """Route dependencies that refuse a request without the cluster secret (401; constant-time compare)."""
    expected = secret.encode()

    def require_secret(value: Annotated[str | None, Header(alias=SECRET_HEADER)] = None) -> None:
        if value is None or not hmac.compare_digest(value.encode(), expected):
            raise HTTPException(status_code=401, detail=f"missing or wrong {SECRET_HEADER}")

    return [Depends(require_secret)]


def add_error_handlers(
    app: FastAPI, status_of: Mapping[type[Exception], Callable[[Exception], int]] | None = None
) -> None:
    """The error policy on `app`; `status_of` adds engine-specific errors (their status from the error)."""
    rules: dict[type[Exception], Callable[[Exception], int]] = {
        error: (lambda exc, status=status: status) for error, status in ERROR_STATUS.items()
    }
    rules.update(status_of or {})
    for error, status in rules.items():

        async def handler(request: Request, exc: Exception, status=status) -> JSONResponse:
            return JSONResponse(status_code=status(exc), content={"detail": str(exc)})

        app.add_exception_handler(error, handler)

    async def internal(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=500, content={"detail": f"{type(exc).__name__}: {exc}"})

    app.add_exception_handler(Exception, internal)
