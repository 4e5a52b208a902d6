"""The lifecycle of engine groups: `absent -> starting -> awake <-> asleep`, and who may use the engines now.

Design / who owns what:
- A group starts on first use (a sample, or a sampler save of a run about to sample), never before.
- `use(group)` is the lease of a sample or a push: it wakes (or starts) the group and counts the user in;
  leaving it counts the user out. A sleep waits for the count to reach zero.
- Colocated engines sleep before a training pass, only if awake (a second pass in a row sends nothing).
  After a level-2 sleep engines hold no adapters, so versions are pushed again before anything samples them.
- Transitions run on the server's event loop, under the group's condition.
- Only the engines tx starts take part: external engines are never started, slept or woken here (they are
  always awake, and never colocated).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tx.inference.groups import EngineGroup, EngineSettings, GroupState
from tx.inference.protocol import ROUTE_SLEEP, ROUTE_WAKE_UP, SleepRequest, WakeUpRequest
from tx.inference.supervisor import Supervisor


class Lifecycle:
    def __init__(self, settings: EngineSettings, supervisor: Supervisor) -> None:
        self.settings = settings
        self.supervisor = supervisor

    @contextlib.asynccontextmanager
    async def use(self, group: EngineGroup) -> AsyncIterator[None]:
        """Hold the group awake (starting it if absent) while the body runs."""
        async with group.cond:
            await self._ensure_awake(group)
            group.active += 1
        try:
            yield
        finally:
            async with group.cond:
                group.active -= 1
                group.cond.notify_all()

    async def _ensure_awake(self, group: EngineGroup) -> None:
        """Start (absent) or wake (asleep) the group. Call with `group.cond` held."""
        if group.state is GroupState.ABSENT:
            group.state = GroupState.STARTING
            try:
                await asyncio.gather(*(self.supervisor.ensure_running(group, s) for s in group.managed()))
            except BaseException:
                group.state = GroupState.ABSENT
                raise
        elif group.state is GroupState.ASLEEP:
            await self.supervisor.control(group, ROUTE_WAKE_UP, WakeUpRequest().model_dump())
        group.state = GroupState.AWAKE

    async def sleep(self, group: EngineGroup) -> None:
        """Put an awake group to sleep once its users are done."""
        async with group.cond:
            await group.cond.wait_for(lambda: group.active == 0)
            if group.state is not GroupState.AWAKE:
                return
            level = self.settings.sleep_level
            await self.supervisor.control(group, ROUTE_SLEEP, SleepRequest(level=level, mode="wait").model_dump())
            if level == 2:
                for slot in group.managed():
                    slot.adapters.clear()
            group.state = GroupState.ASLEEP
