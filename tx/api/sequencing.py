"""The sequencing rules at the HTTP edge: a sequenced request (it names a model and a seq_id) that is refused
used its seq_id all the same, so the model's queue moves past it at once instead of waiting out the gap
timeout (the SDK never resends a seq_id), except a 429 (a key's queued-work quota,
`QuotaExceededError.transient`): the SDK resends that very call, so its seq_id stays free. The queue itself
is `tx/core/scheduler.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

from fastapi import Request

from tx.api.context import Context
from tx.api.deps import Ctx
from tx.types import ConflictError, NotFoundError, QuotaExceededError, UserError

REFUSED = (UserError, NotFoundError, ConflictError)  # a request's own 4xx: its seq_id was used all the same


@contextlib.asynccontextmanager
async def uses_seq(ctx: Ctx, owner: str, model_id: str, seq_id: int) -> AsyncIterator[None]:
    """A sequenced request refused at submission still used its seq_id (the SDK never resends it):
    on a 4xx the model's queue moves past it, so the next call does not wait out the gap timeout. Not on a 429
    for a transient quota: the SDK resends the call, with this seq_id, once queued work ran."""
    try:
        yield
    except REFUSED as exc:
        if not _resent(exc):
            await asyncio.to_thread(ctx.sequencer.reject, owner, model_id, seq_id)
        raise


@contextlib.contextmanager
def uses_seq_in_thread(ctx: Context, owner: str, model_id: str, seq_id: int) -> Iterator[None]:
    """`uses_seq` for a request handled in a worker thread."""
    try:
        yield
    except REFUSED as exc:
        if not _resent(exc):
            ctx.sequencer.reject(owner, model_id, seq_id)
        raise


def _resent(exc: Exception) -> bool:
    """A transient quota's 429: the SDK resends this very call, so its seq_id stays free."""
    return isinstance(exc, QuotaExceededError) and exc.transient


async def reject_seq_of_invalid_body(request: Request, body: object) -> None:
    """A sequenced JSON request (it names model_id and seq_id) refused as invalid (422) used its seq_id too."""
    if not (isinstance(body, dict) and isinstance(body.get("model_id"), str)):
        return
    seq_id = body.get("seq_id")
    if isinstance(seq_id, int) and not isinstance(seq_id, bool) and seq_id >= 1:
        owner = request.app.state.key_checker(request).owner
        await asyncio.to_thread(request.app.state.ctx.sequencer.reject, owner, body["model_id"], seq_id)


def require_seq(seq_id: int | None) -> int:
    """The seq_id a sequenced request must carry; a UserError (400) without one."""
    if seq_id is None:
        raise UserError("this request needs a seq_id (>= 1)")
    return seq_id
