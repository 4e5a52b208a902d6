"""JSON bodies of `POST /api/v1/copy_weights` (docs/wire-contract.md#copies), mirroring tinker 0.38.0."""

from __future__ import annotations

from pydantic import Field

from tx.api.wire.schemas.base import WireRequest, WireResponse


class CopyWeightsRequest(WireRequest):
    """A destination project, or a session and its model slot; the SDK always sends a project."""

    source_path: str = Field(max_length=1024)
    destination_project_id: str | None = Field(None, min_length=1, max_length=128)
    session_id: str | None = Field(None, max_length=64)
    model_seq_id: int | None = Field(None, ge=0, le=2**31 - 1)
    ttl_seconds: int | None = None
    weights_access_token: str | None = Field(None, max_length=4096)


class CopyWeightsResponse(WireResponse):
    tinker_path: str
