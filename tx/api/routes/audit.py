"""The audit log (row 41; `AdminClient.get_audit_log`), and the billing routes (rows 42-43), which tx does not
have: they answer 404 with a body that says so (a 404 is final for the SDK; a 5xx would be retried for minutes)."""

from __future__ import annotations

import asyncio
from datetime import date, datetime, timezone
from typing import Literal

from fastapi import APIRouter, HTTPException, Query

from tx.api.deps import Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.wire.schemas.audit import AuditLogEntry, AuditLogResponse
from tx.core.audit import AuditEntry, urn

router = APIRouter(tags=["audit"], responses=COMMON_ERRORS)
EventType = Literal["all", "checkpoints", "runs", "keys", "projects", "teams", "organizations"]
NO_BILLING = "tx does not bill: there is no billing usage on this server (see its /metrics for token counts)"


@router.get("/audit")
async def audit_log(ctx: Ctx, caller: Caller, event_type: EventType = "all",
                    day: date | None = Query(None, description="a UTC day (default today)")) -> AuditLogResponse:
    """One UTC day of entries, oldest first: the caller's own (what they did, or what was done to what they
    own); an operator key reads every entry."""
    day = day or datetime.now(timezone.utc).date()
    entries = await asyncio.to_thread(ctx.audit.day, caller.owner, caller.operator, day, event_type)
    return AuditLogResponse(entries=[_entry(e) for e in entries])


@router.get("/billing/usage/events", responses=error_responses(404))
async def billing_usage(_: Caller) -> None:
    raise HTTPException(404, NO_BILLING)


@router.get("/billing/usage/checkpoints/current", responses=error_responses(404))
async def checkpoint_storage_usage(_: Caller) -> None:
    raise HTTPException(404, NO_BILLING)


def _entry(entry: AuditEntry) -> AuditLogEntry:
    details = {"actor": urn(entry.actor), **entry.details}
    if entry.subject_owner is not None:
        details["owner"] = urn(entry.subject_owner)
    if entry.run_id is not None:
        details["training_run_id"] = entry.run_id
    if entry.tinker_path is not None:
        details["tinker_path"] = entry.tinker_path
    checkpoint = entry.event.startswith("checkpoint_")
    return AuditLogEntry(timestamp=entry.at, event=entry.event, event_details=details,
                         model_id=entry.run_id if checkpoint else None,
                         tinker_path=entry.tinker_path if checkpoint else None,
                         purpose=entry.details.get("purpose") if entry.event == "checkpoint_read" else None)
