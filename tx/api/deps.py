"""FastAPI dependencies shared by the routes: the service context and the caller."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from tx.api.auth import Principal

if TYPE_CHECKING:
    from tx.api.context import Context


def get_ctx(request: Request) -> Context:
    return request.app.state.ctx


def get_principal(request: Request) -> Principal:
    return request.app.state.key_checker(request)


def require_operator(request: Request) -> None:
    request.app.state.operator_checker(request)


MAX_OFFSET = 2**53  # list offsets above this are refused (a 64-bit store integer overflows near 2**63)

Ctx = Annotated["Context", Depends(get_ctx)]
Caller = Annotated[Principal, Depends(get_principal)]
Operator = Annotated[None, Depends(require_operator)]
