"""Closing the supervisor stops its engines at once, not one after the other (a server of many base models
stopped one engine at a time: ~1.5 s each for embedded engines, up to 30 s each for vLLM)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tx.inference.manager.client import InferenceClient
from tx.inference.manager.groups import EngineGroup, EngineSlot
from tx.inference.manager.supervisor import Supervisor

STOP_S = 0.5


class SlowStops:
    """A launcher whose every stop takes STOP_S; it records what it stopped."""

    def __init__(self) -> None:
        self.stopped: list[object] = []
        self.closed = False

    async def stop(self, engine: object) -> None:
        await asyncio.sleep(STOP_S)
        self.stopped.append(engine)

    async def close(self) -> None:
        self.closed = True


class Handle:
    alive = True


def test_engines_stop_at_once() -> None:
    launcher = SlowStops()
    forgotten: list[str] = []
    groups = [EngineGroup(f"model-{g}", Path("/nowhere"),
                          {f"e{i}": EngineSlot(f"e{i}", process=Handle()) for i in range(3)}) for g in range(2)]

    async def close() -> float:
        supervisor = Supervisor(launcher, InferenceClient(engines={}, secret="s"), 1.0,
                                lambda slot: forgotten.append(slot.name))
        started = time.monotonic()
        await supervisor.close(groups)
        return time.monotonic() - started

    took = asyncio.run(close())
    assert len(launcher.stopped) == 6 and launcher.closed and len(forgotten) == 6
    assert all(slot.process is None for group in groups for slot in group.slots.values())
    assert took < 3 * STOP_S, f"6 stops of {STOP_S} s took {took:.2f} s"
