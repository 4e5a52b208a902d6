"""`POST /api/v1/tx/checkpoints/import` (tx's own, behind `tx checkpoints import`): a PEFT LoRA trained elsewhere
becomes a training-state checkpoint of the caller's (`tx/core/checkpoints/imports.py`).

The body is the adapter's safetensors file, its `adapter_config.json` carried in the file's metadata (key
`adapter_config`), so one body holds both; it counts against `--max-request-bytes` as it arrives and goes to a
private file, never into memory whole. The answer is a future whose result is the checkpoint's path.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from fastapi import APIRouter, Query, Request

from tx.api.deps import Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.wire.schemas.futures import UntypedAPIFuture

router = APIRouter(tags=["checkpoints"], responses=COMMON_ERRORS | error_responses(404))
IMPORT_ROUTE = "/tx/checkpoints/import"


@router.post(IMPORT_ROUTE)
async def import_adapter(
    request: Request, ctx: Ctx, caller: Caller,
    base_model: str = Query(max_length=512), name: str = Query(max_length=200),
    project_id: str | None = Query(None, max_length=256),
) -> UntypedAPIFuture:
    upload = await _receive(request, ctx.imports.files.uploads_dir())
    future = await asyncio.to_thread(ctx.imports.submit, caller.owner, upload, base_model, name, project_id)
    return UntypedAPIFuture(request_id=future.request_id, model_id=None)


async def _receive(request: Request, directory: Path) -> Path:
    """The body, written to a new private file in `directory` off the event loop (deleted if it fails)."""
    with tempfile.NamedTemporaryFile(dir=directory, prefix="upload-", suffix=".safetensors", delete=False) as handle:
        path = Path(handle.name)
        try:
            async for chunk in request.stream():
                if chunk:
                    await asyncio.to_thread(handle.write, chunk)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
    return path
