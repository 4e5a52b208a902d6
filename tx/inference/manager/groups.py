"""The engine manager's data: settings, one group of engines per served base model, one slot per engine.

A slot is a stable place for one engine (its name survives restarts, so routing stays sticky); the process in
it changes when the engine is restarted (the supervisor owns `process`). What the engine process holds (the
weight transport, the collective group, the adapters loaded) is the publisher's (`publisher.py`), which
forgets it when the process is replaced. An external engine (`tx serve --engine-url`) has a slot too, holding
an `ExternalHandle` for good: tx never starts or stops it (`external.py`).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from tx.config.sections import EngineSection
from tx.inference.launch import EngineHandle
from tx.inference.manager.external import ExternalEngine, ExternalHandle
from tx.inference.manager.router import Router


class GroupState(enum.Enum):
    ABSENT = "absent"
    STARTING = "starting"
    AWAKE = "awake"
    ASLEEP = "asleep"


@dataclass(frozen=True)
class EngineSettings:
    count: int = 1  # engines tx starts per base model
    count_with_external: int = 0  # ... per base model that has external engines
    probe_interval_s: float = 2.0  # how often an external engine that is down is probed
    colocate: bool = False
    sleep_level: int = 1
    max_adapters: int = 8  # weight versions an engine keeps loaded
    versions_kept: int = 8  # weight versions each run holds (older sampling clients then fail)
    control_timeout_s: float = 120.0
    training_wait_s: float = 5.0  # a colocated training pass waits this long for in-flight samples, then pauses them
    transfer_timeout_s: float = 120.0
    trainer_device: str = "cpu"  # where the trainer runs: cpu, cuda, cuda:N (picks the weight transport)
    self_check: bool = False  # check the engines against the trainer before sampling (`selfcheck.py`)

    @classmethod
    def build(cls, section: EngineSection, *, colocate: bool, trainer_device: str,
              self_check: bool = False) -> EngineSettings:
        """The manager's settings from the engines' section of the server's settings, with the two facts only
        known at run time: whether engines share the trainer's accelerator, and where the trainer runs."""
        return cls(
            count=section.managed_count(False), count_with_external=section.managed_count(True),
            colocate=colocate, sleep_level=section.sleep_level, max_adapters=section.max_adapters,
            versions_kept=section.versions_kept, trainer_device=trainer_device,
            training_wait_s=section.training_wait_s, probe_interval_s=section.probe_interval_s,
            self_check=self_check,
        )


@dataclass
class EngineSlot:
    name: str
    process: EngineHandle | None = None  # written by the supervisor only
    restarts: int = 0  # processes of this slot replaced after a failure (written by the supervisor only)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # held to start the process or load weights into it

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.alive

    @property
    def external(self) -> bool:
        return isinstance(self.process, ExternalHandle)

    @property
    def external_handle(self) -> ExternalHandle | None:
        """The external engine in this slot; None for a managed one."""
        return self.process if isinstance(self.process, ExternalHandle) else None


@dataclass
class EngineGroup:
    base_model: str
    model_dir: Path
    slots: dict[str, EngineSlot]
    state: GroupState = GroupState.ABSENT
    active: int = 0  # samples and pushes using the engines now (a training pass waits for them, up to a bound)
    training: bool = False  # the trainer holds the (colocated) device: nothing wakes the engines
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def router(self) -> Router:
        return Router(sorted(self.slots))

    def alive(self) -> list[str]:
        return [key for key, slot in self.slots.items() if slot.alive]

    def pick(self, sampler_id: str, failed: AbstractSet[str] = frozenset()) -> str:
        """The session's engine among the live ones not in `failed` (when none is live: a managed one, which
        is then restarted); RuntimeError when only external engines that are down are left."""
        live = [key for key in self.alive() if key not in failed]
        candidates = live or [key for key, slot in self.slots.items() if not slot.external]
        if not candidates:
            down = "; ".join(f"{handle.url}: {handle.problem}" for s in self.slots.values()
                             if (handle := s.external_handle) is not None)
            raise RuntimeError(f"no engine of {self.base_model} can sample now (external engines down: {down})")
        return self.router.pick(sampler_id, candidates)

    def managed(self) -> list[EngineSlot]:
        """The slots of engines tx starts itself (not external ones)."""
        return [slot for slot in self.slots.values() if not slot.external]


def build_groups(model_dirs: dict[str, Path], settings: EngineSettings,
                 externals: Sequence[ExternalEngine] = ()) -> dict[str, EngineGroup]:
    groups = {}
    for name, path in model_dirs.items():
        mine = [e for e in externals if e.base_model == name]
        count = settings.count_with_external if mine else settings.count
        slots = {f"{i}": EngineSlot(f"{_slug(name)}-{i}") for i in range(count)}
        for i, engine in enumerate(mine):
            slot_name = f"{_slug(name)}-x{i}"
            slots[f"x{i}"] = EngineSlot(slot_name, ExternalHandle(slot_name, engine.url, engine.fingerprint))
        groups[name] = EngineGroup(name, path, slots)
    return groups


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)[-40:].strip("-") or "model"
