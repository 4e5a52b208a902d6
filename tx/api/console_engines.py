"""The console's engines page: the manager's report (`GET /api/v1/tx/engines`) read as one row per engine, with
its state, the weight versions it holds, its queue, its generated tokens per second (from the previous read),
and its restarts; and the trainer's GPU memory when the trainer is on one."""

from __future__ import annotations

import sys
import time
from typing import Any

from tx.api.wire.schemas.console import ConsoleEngine, ConsoleEngineGroup, ConsoleEngines
from tx.inference.manager import EngineManager


class EngineRates:
    """Generated tokens per second per engine, between two reads of the page."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def rate(self, name: str, tokens: int) -> float | None:
        now = time.monotonic()
        previous = self._last.get(name)
        self._last[name] = (now, tokens)
        if previous is None or now <= previous[0] or tokens < previous[1]:
            return None
        return (tokens - previous[1]) / (now - previous[0])


async def engines_view(manager: EngineManager, rates: EngineRates) -> ConsoleEngines:
    groups = await manager.describe()
    return ConsoleEngines(
        groups=[ConsoleEngineGroup(base_model=g["base_model"], state=g["state"],
                                   engines=[_engine(e, g["state"], rates) for e in g["engines"]]) for g in groups],
        restarts=manager.supervisor.restarts, gpu_memory=_gpu_memory(manager.settings.trainer_device),
    )


def _engine(info: dict[str, Any], group_state: str, rates: EngineRates) -> ConsoleEngine:
    health = info.get("health") or {}
    ok = "error" not in health and bool(health)
    stats = health.get("stats") or {}
    tokens = int(stats.get("num_generated_tokens", 0))
    transport = info.get("transport") or {}
    return ConsoleEngine(
        name=info["name"], state=_state(info, health, ok, group_state), pid=info.get("pid"), url=info.get("url"),
        weight_versions=[str(v or k) for k, v in (health.get("adapters") or {}).items()] if ok else list(info["adapters"]),
        running=int(health.get("num_running", 0)), waiting=int(health.get("num_waiting", 0)),
        generated_tokens=tokens, tokens_per_s=rates.rate(info["name"], tokens) if ok else None,
        restarts=int(info.get("restarts", 0)) + int(info.get("rejoins") or 0), transport=transport.get("kind"),
        device=health.get("device") if ok else None, problem=info.get("problem") or health.get("error"),
    )


def _state(info: dict[str, Any], health: dict[str, Any], ok: bool, group_state: str) -> str:
    if info.get("external"):
        return "external" if info.get("state") != "down" and ok else "down"
    if info.get("pid") is None:
        return "starting" if group_state == "starting" else "absent"
    if not info.get("alive"):
        return "down"
    if not ok:
        return "starting" if group_state == "starting" else "down"
    return "asleep" if health.get("sleeping_level", 0) else "awake"


def _gpu_memory(trainer_device: str) -> dict[str, int] | None:
    """Free and total bytes of the trainer's GPU (torch is already loaded when the trainer is on one)."""
    torch = sys.modules.get("torch")
    if not trainer_device.startswith("cuda") or torch is None or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(torch.device(trainer_device))
    return {"free": int(free), "total": int(total)}
