"""JSON bodies of `GET /api/v1/audit` (docs/wire-contract.md#the-audit-log), mirroring tinker 0.38.0's AuditLogResponse."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from tx.api.wire.schemas.base import WireResponse


class AuditLogEntry(WireResponse):
    timestamp: datetime
    event: str = Field(description="<resource>_<action>, e.g. checkpoint_read")
    event_details: dict[str, Any] = Field(default_factory=dict, description="who did it, to what, and the rest")
    model_id: str | None = None
    tinker_path: str | None = None
    purpose: str | None = None


class AuditLogResponse(WireResponse):
    entries: list[AuditLogEntry]
