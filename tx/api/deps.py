"""FastAPI dependencies shared by the routes: the service context and the caller.

They are `async def` because they only read app state and hash a key: FastAPI runs a plain `def` dependency on
a worker thread, a thread hop on every request (on the sampling path: docs/engines.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from tx.api.auth import Principal

if TYPE_CHECKING:
    from tx.api.context import Context


async def get_ctx(request: Request) -> Context:
    return request.app.state.ctx


async def get_principal(request: Request) -> Principal:
    return request.app.state.key_checker(request)


async def require_operator(request: Request) -> None:
    request.app.state.operator_checker(request)


MAX_OFFSET = 2**53  # list offsets above this are refused (a 64-bit store integer overflows near 2**63)

Ctx = Annotated["Context", Depends(get_ctx)]
Caller = Annotated[Principal, Depends(get_principal)]
Operator = Annotated[None, Depends(require_operator)]
