"""Sessions: create, heartbeat, finish, and the REST reads."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from tx.api.wire.schemas.base import Tags, UserMetadata, WireRequest, WireResponse


class CreateSessionRequest(WireRequest):
    tags: Tags = Field(default_factory=list)
    user_metadata: UserMetadata = None
    sdk_version: str | None = None
    project_id: str | None = None
    display_name: str | None = None
    type: Literal["create_session"] = "create_session"


class CreateSessionResponse(WireResponse):
    session_id: str
    type: Literal["create_session"] = "create_session"
    info_message: str | None = None
    warning_message: str | None = None
    error_message: str | None = None


class SessionHeartbeatRequest(WireRequest):
    session_id: str
    type: Literal["session_heartbeat"] = "session_heartbeat"


class SessionHeartbeatResponse(WireResponse):
    type: Literal["session_heartbeat"] = "session_heartbeat"


class SessionFinishReason(WireRequest):
    type: Literal["success", "errored", "interrupted"]


class SessionFinishRequest(WireRequest):
    """POST /api/v1/sessions/{session_id}/finish."""

    reason: SessionFinishReason
    detail: str | None = None


class ListSessionsResponse(WireResponse):
    sessions: list[str]


class GetSessionResponse(WireResponse):
    training_run_ids: list[str]
    sampler_ids: list[str]
    user_metadata: dict[str, str] | None = None
    display_name: str | None = None


class AssignProjectRequest(WireRequest):
    project_id: str = Field(min_length=1, max_length=128)


class TraceExportResponse(WireResponse):
    status: Literal["pending", "ready", "failed"]
    url: str | None = None
    error: str | None = None


class SessionStatusQuery(WireRequest):
    type: Literal["active", "cancelled", "failed", "client_finished"]
    reasons: list[Literal["success", "errored", "interrupted"]] | None = Field(None, min_length=1)


class SessionSearchOwner(WireRequest):
    type: Literal["own", "accessible", "user"] = "own"
    owner_urns: list[str] | None = None


class SessionSearchCursor(WireRequest):
    last_created_at: datetime
    last_session_id: str


class SessionSearchRequest(WireRequest):
    session_id: str | None = None
    project_ids: list[str] | None = None
    user_metadata: dict[str, str] = Field(default_factory=dict)
    display_name: str | None = Field(None, min_length=1)
    owner: SessionSearchOwner = Field(default_factory=SessionSearchOwner)
    statuses: list[SessionStatusQuery] | None = Field(None, min_length=1)
    limit: int = Field(50, ge=1, le=200)
    cursor: SessionSearchCursor | None = None


class SessionSummary(WireResponse):
    session_id: str
    created_at: datetime
    owner: str
    project_id: str
    status: dict[str, Any] | None = None
    checkpoints_count: int
    display_name: str | None = None
    user_metadata: dict[str, str] | None = None
    checkpoint_storage_bytes: int | None = None


class SessionSearchResponse(WireResponse):
    sessions: list[SessionSummary]
    next_cursor: SessionSearchCursor | None = None
