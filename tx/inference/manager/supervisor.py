"""Supervision: engine processes in their slots are started, restarted when they die, and stopped.

Design / who owns what:
- `ensure_running` starts the slot's engine if it has none or the one it has is dead (under the slot's lock,
  so concurrent callers start one process).
- `restart(slot, failed)` replaces the process that failed, and only that one: when many requests see the
  same engine die, the first restarts it and the others find a new, live process in the slot and leave it be.
- A dead engine found while routing is restarted in the background; requests go to live engines meanwhile.
- `control` fans a control call out to a group and restarts each engine that failed it, so the group stays
  consistent (a restarted engine is awake and holds no adapters).
- External engines are never started, restarted, stopped or sent control calls: `ensure_running` only checks
  that one is up (and has joined), and `restart` marks it down for `ExternalEngines` to probe until it
  rejoins.
"""

from __future__ import annotations

import asyncio
import logging

from tx.inference.launch import EngineHandle, Launcher
from collections.abc import Callable

from tx.inference.manager.client import InferenceClient
from tx.inference.manager.external_watch import ExternalEngines
from tx.inference.manager.groups import EngineGroup, EngineSlot

logger = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, launcher: Launcher, client: InferenceClient, control_timeout_s: float,
                 forget: Callable[[EngineSlot], None], probe_interval_s: float = 2.0, max_adapters: int = 1) -> None:
        """`forget`: tells the owner of what engines hold (the publisher) that a slot's process is new."""
        self.launcher = launcher
        self.client = client
        self.control_timeout_s = control_timeout_s
        self._forget = forget
        self.external = ExternalEngines(client, probe_interval_s, control_timeout_s, forget, max_adapters)
        self.restarts = 0  # processes replaced after a failure (for operators and tests)
        self.closed = False
        self._background: set[asyncio.Task] = set()

    def watch_external(self, loop: asyncio.AbstractEventLoop, slots: list[EngineSlot]) -> None:
        """Probe the external engines among `slots` while tx serves (`external_watch.py`)."""
        self.external.watch(loop, slots)

    def mark_down(self, slot: EngineSlot, reason: str) -> None:
        """An external engine failed a request or a push: out of routing, probed until it rejoins."""
        self.external.mark_down(slot, reason)

    async def ensure_running(self, group: EngineGroup, slot: EngineSlot) -> None:
        """A live engine in the slot; an external one that is down raises EngineUnavailable."""
        async with slot.lock:
            if slot.external:
                await self.external.ensure_joined(slot)
            else:
                await self._start_unless_alive(group, slot)

    async def _start_unless_alive(self, group: EngineGroup, slot: EngineSlot) -> None:
        if slot.alive:
            return
        if self.closed:
            raise RuntimeError("the server is shutting down: no engine is started")
        if slot.process is not None:
            logger.warning("engine %s (pid %s) is dead; restarting it", slot.name, slot.process.pid)
            self.restarts += 1
            slot.restarts += 1
        self._forget(slot)
        slot.process = await self.launcher.start(slot.name, group.model_dir)
        self.client.engines[slot.name] = slot.process.url

    async def restart(self, group: EngineGroup, slot: EngineSlot, failed: EngineHandle | None) -> None:
        """Replace `failed` (the process a caller saw fail). A process already put in its place is kept.
        An external engine is not replaced: it is marked down (and probed until it rejoins)."""
        if slot.external:
            self.external.mark_down(slot, "it failed a request")
            return
        async with slot.lock:
            if failed is not None and slot.process is failed:
                if failed.alive:
                    await self.launcher.stop(failed)  # alive but failing: stop it before starting anew
                    self.restarts += 1
                    slot.restarts += 1
                    self._forget(slot)
                    slot.process = None
            await self._start_unless_alive(group, slot)

    def restart_dead_in_background(self, group: EngineGroup) -> None:
        """Requests skip a dead engine; it comes back on its own, without holding them up."""
        for slot in group.managed():
            if slot.process is not None and not slot.alive and not slot.lock.locked():
                task = asyncio.create_task(self.ensure_running(group, slot))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def control(self, group: EngineGroup, path: str, body: dict) -> None:
        """Fan a control call out; an engine that fails it is restarted (restarted engines are awake)."""
        slots = {s.name: (s, s.process) for s in group.managed() if s.process is not None}
        results = await self.client.fan_out(path, body, self.control_timeout_s, list(slots))
        for name, result in results.items():
            if isinstance(result, BaseException):
                logger.warning("engine %s failed %s (%s); restarting it", name, path, result)
                slot, process = slots[name]
                await self.restart(group, slot, process)

    async def close(self, groups: list[EngineGroup]) -> None:
        self.closed = True  # a request that meets a stopped engine now fails instead of starting one
        for task in list(self._background):
            task.cancel()
        await self.external.close()
        stops = []
        for group in groups:
            for slot in group.slots.values():
                self._forget(slot)
                if slot.process is not None and not slot.external:
                    stops.append(self.launcher.stop(slot.process))
                    slot.process = None
        # at once: each waits for its engine to exit (a vLLM one up to 30 s)
        for result in await asyncio.gather(*stops, return_exceptions=True):
            if isinstance(result, BaseException):
                logger.warning("stopping an engine failed: %s", result)
        await self.launcher.close()
