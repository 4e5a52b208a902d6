"""The lifecycle of engine groups: `absent -> starting -> awake <-> asleep`, and who may use the engines now.

Design / who owns what:
- A group starts on first use (a sample, or a sampler save of a run about to sample), never before.
- Colocation is a lease on the accelerator. The trainer takes it for a training pass (`take_for_training`) and
  gives it back after (`give_back`). While the trainer holds it, engines are neither woken nor started: a
  sample that arrives waits for the pass to end.
- `use(group)` is a sample's or a push's hold on the engines: it waits while the trainer holds the device, wakes
  (or starts) the group and counts the user in; leaving it counts the user out.
- Taking the lease waits for in-flight users up to `training_wait_s`, then sleeps the engines with `abort`:
  their requests come back aborted, and `resume_after_training` lets the sample wait for the pass and go on
  with its tokens so far. So steady sampling cannot starve training.
- Engines sleep only if awake (a second pass in a row sends nothing). After a level-2 sleep engines hold no
  adapters, so versions are pushed again before anything samples them.
- Transitions run on the server's event loop, under the group's condition.
- Only the engines tx starts take part: external engines are never started, slept or woken here (they are
  always awake, and never colocated).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Literal

from tx.inference.manager.groups import EngineGroup, EngineSettings, GroupState
from tx.inference.manager.publisher import Publisher
from tx.inference.manager.supervisor import Supervisor
from tx.inference.protocol import ROUTE_SLEEP, ROUTE_WAKE_UP, SleepRequest, WakeUpRequest

logger = logging.getLogger(__name__)


class Lifecycle:
    def __init__(self, settings: EngineSettings, supervisor: Supervisor, publisher: Publisher) -> None:
        self.settings = settings
        self.supervisor = supervisor
        self.publisher = publisher

    @contextlib.asynccontextmanager
    async def use(self, group: EngineGroup) -> AsyncIterator[None]:
        """Hold the group awake (starting it if absent) while the body runs."""
        async with group.cond:
            await group.cond.wait_for(lambda: not group.training)
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

    async def resume_after_training(self, group: EngineGroup) -> None:
        """A user's request came back aborted: if the trainer took the device, step out until the pass is over,
        then wake the engines again. Call inside `use(group)`."""
        async with group.cond:
            if not group.training and group.state is GroupState.AWAKE:
                return
            group.active -= 1
            group.cond.notify_all()
            await group.cond.wait_for(lambda: not group.training)
            await self._ensure_awake(group)
            group.active += 1

    async def take_for_training(self, group: EngineGroup) -> None:
        """The trainer takes the device: no user may wake the engines until `give_back`; in-flight users get
        `training_wait_s` to finish, then their requests are aborted (and resumed after the pass)."""
        async with group.cond:
            group.training = True
            if not await self._drained(group, self.settings.training_wait_s):
                logger.info("%d samples still running on %s after %.1f s; pausing them for the training pass",
                            group.active, group.base_model, self.settings.training_wait_s)
            if group.state is not GroupState.AWAKE:
                return
            level: Literal[1, 2] = 2 if self.settings.sleep_level == 2 else 1  # the config allows 1 or 2
            mode = "wait" if group.active == 0 else "abort"
            await self.supervisor.control(group, ROUTE_SLEEP, SleepRequest(level=level, mode=mode).model_dump())
            if level == 2:
                for slot in group.managed():
                    self.publisher.forget_adapters(slot)
            group.state = GroupState.ASLEEP

    async def give_back(self, group: EngineGroup) -> None:
        async with group.cond:
            group.training = False
            group.cond.notify_all()

    async def _drained(self, group: EngineGroup, wait_s: float) -> bool:
        """Wait (with `group.cond` held) until no user is in, at most `wait_s`; whether none is."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while group.active and (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(group.cond.wait(), left)
            except TimeoutError:
                break
        return group.active == 0
