"""Signed downloads (no API key: the link is the credential; see `tx.core.checkpoints.downloads`).

Checkpoint files are streamed from disk with HTTP Range support (FileResponse); a session's
trace is built when it is fetched.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from tx.api.deps import Ctx
from tx.api.errors import error_responses

router = APIRouter(tags=["downloads"], responses=error_responses(404))


@router.get("/downloads/{token}")
async def download(token: str, ctx: Ctx) -> Response:
    scope = ctx.catalog.signer.verify(token)
    if scope.kind == "trace":
        body = await asyncio.to_thread(ctx.sessions.trace_json, scope.owner, scope.session_id)
        return Response(body, media_type="application/json",
                        headers={"Content-Disposition": f'attachment; filename="{scope.session_id}.json"'})
    path = await asyncio.to_thread(ctx.catalog.linked_file, scope)
    return FileResponse(path, media_type="application/octet-stream", filename=path.name)
