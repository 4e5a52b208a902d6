"""What operators see of the engines (`GET /api/v1/tx/engines`): each group's state, and each engine's
process (or, for an external engine, whether it is up), transport, adapters and health."""

from __future__ import annotations

from typing import Any

from tx.inference.manager.client import EngineRequestError, EngineUnavailable, InferenceClient
from tx.inference.manager.external import ExternalHandle
from tx.inference.manager.groups import EngineGroup, EngineSlot
from tx.inference.manager.publisher import Publisher
from tx.inference.protocol import ROUTE_HEALTH


async def describe_groups(groups: list[EngineGroup], client: InferenceClient,
                          publisher: Publisher) -> list[dict[str, Any]]:
    return [
        {"base_model": group.base_model, "state": group.state.value,
         "engines": [await _describe_slot(slot, client, publisher) for slot in group.slots.values()]}
        for group in groups
    ]


async def _describe_slot(slot: EngineSlot, client: InferenceClient, publisher: Publisher) -> dict[str, Any]:
    info: dict[str, Any] = {"name": slot.name, "adapters": list(publisher.held(slot).adapters), "pid": None, "alive": False,
                            "external": slot.external, "restarts": slot.restarts}
    if isinstance(slot.process, ExternalHandle):  # started by someone else: up or down, and why
        info.update(state=slot.process.state, problem=slot.process.problem, rejoins=slot.process.rejoins)
    if (t := publisher.held(slot).transport) is not None:
        info["transport"] = {"kind": t.kind, "master_address": t.master_address, "reason": t.reason}
    if slot.process is not None:
        info.update(pid=slot.process.pid, alive=slot.process.alive, url=slot.process.url)
        try:
            info["health"] = await client.get(slot.name, ROUTE_HEALTH, 5.0)
        except (EngineUnavailable, EngineRequestError) as exc:
            info["health"] = {"error": str(exc)}
    return info
