"""EngineManager: lazy engines, the colocated sleep/wake cycle, weight versions, supervision.

Design / who owns what:
- One engine group per served base model: `absent -> starting -> awake <-> asleep`. Engines start on
  the first sample (or the first sampler save of a run that is about to sample), never before.
- Weight versions are LoRA adapters named after the sampler weights directory they came from. Every
  sampling client is pinned to its directory; an engine loads a version on first use (pushed over
  the transfer group) and keeps the most recent `max_adapters`. A version whose files were evicted
  is a clear user error.
- Colocated engines sleep before a training pass (only if awake, after in-flight samples finish);
  a sample wakes them. After a level-2 sleep engines hold no adapters, so versions are pushed again
  before anything samples them.
- Weights travel over the transport `weight_sync.transport.choose_transport` picks per engine, from the
  trainer's device (`EngineSettings.trainer_device`) and what the engine's `/health` reports: CUDA IPC into an
  engine on the trainer's own GPU, NCCL to one on another GPU, gloo when either side is on cpu (the tensors
  are read from the sampler's PEFT directory on cpu; NCCL and IPC move them to the trainer's GPU first). The
  choice is made once per engine process; a restarted engine is asked again.
- An engine that died is restarted on the next request; the request it held is retried once, then
  failed with a server error. A control call that fails on one engine restarts that engine, so the
  group stays consistent.
- Runs on the server's event loop; `before_training` and `publish_sync` are the entry points for the
  training thread.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import json
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import safetensors.torch
import torch

from tx.inference.client import EngineRequestError, EngineUnavailable, InferenceClient
from tx.inference.launch import EngineHandle, Launcher
from tx.inference.protocol import (
    ROUTE_ADAPTER,
    ROUTE_HEALTH,
    ROUTE_SLEEP,
    ROUTE_WAKE_UP,
    ROUTE_WEIGHTS_FINISH,
    ROUTE_WEIGHTS_INIT,
    ROUTE_WEIGHTS_UPDATE,
    ROUTE_WEIGHTS_UPDATE_IPC,
    GenerateRequest,
    IpcWeightsUpdateRequest,
    LoraSpec,
    SleepRequest,
    WakeUpRequest,
    WeightsFinishRequest,
    WeightsUpdateRequest,
)
from tx.inference.router import Router
from tx.inference.weight_sync import (
    BroadcastSender,
    EngineFacts,
    IpcSender,
    TrainerFacts,
    TransferInit,
    TransferUpdate,
    TransportChoice,
    choose_transport,
    free_port,
    plan_update,
    trainer_facts,
)
from tx.multimodal import ExpandedInput, expand_input
from tx.types import SampleRequest, SampleResult, UserError

logger = logging.getLogger(__name__)


class GroupState(enum.Enum):
    ABSENT = "absent"
    STARTING = "starting"
    AWAKE = "awake"
    ASLEEP = "asleep"


@dataclass(frozen=True)
class EngineSettings:
    count: int = 1
    colocate: bool = False
    sleep_level: int = 1
    max_adapters: int = 8
    control_timeout_s: float = 120.0
    transfer_timeout_s: float = 120.0
    trainer_device: str = "cpu"  # where the trainer runs: cpu, cuda, cuda:N (picks the weight transport)


@dataclass
class EngineSlot:
    name: str
    process: EngineHandle | None = None
    transport: TransportChoice | None = None  # chosen on the first push to this engine process
    sender: BroadcastSender | None = None  # the collective group (gloo, nccl); None for ipc
    adapters: OrderedDict[str, None] = field(default_factory=OrderedDict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def reset(self) -> None:
        if self.sender is not None:
            self.sender.close()
        self.sender, self.transport, self.adapters = None, None, OrderedDict()


@dataclass
class EngineGroup:
    base_model: str
    model_dir: Path
    slots: dict[str, EngineSlot]
    state: GroupState = GroupState.ABSENT
    active: int = 0
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def router(self) -> Router:
        return Router(sorted(self.slots))


def adapter_name(weights_dir: Path) -> str:
    return "v-" + hashlib.sha256(str(weights_dir.resolve()).encode()).hexdigest()[:16]


def read_adapter(weights_dir: Path) -> tuple[list[tuple[str, object]], LoraSpec]:
    """The tensors (sorted by name) and LoRA shape of a PEFT adapter directory."""
    if not (weights_dir / "adapter_model.safetensors").is_file():
        raise UserError(
            "the weights this sampler was created from are no longer kept on the server "
            "(evicted); create a new sampling client from newer weights"
        )
    tensors = safetensors.torch.load_file(str(weights_dir / "adapter_model.safetensors"))
    config = json.loads((weights_dir / "adapter_config.json").read_text())
    spec = LoraSpec(r=config["r"], lora_alpha=config["lora_alpha"], target_modules=sorted(config["target_modules"]))
    return sorted(tensors.items()), spec


class EngineManager:
    def __init__(self, model_dirs: dict[str, Path], settings: EngineSettings, launcher: Launcher) -> None:
        self.settings = settings
        self.launcher = launcher
        self.client = InferenceClient(engines={}, secret=launcher.secret)
        self.groups = {
            name: EngineGroup(name, path, {f"{i}": EngineSlot(f"{_slug(name)}-{i}") for i in range(settings.count)})
            for name, path in model_dirs.items()
        }
        self.in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task] = set()
        self._trainer: TrainerFacts | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def engine_processes(self) -> list[EngineHandle]:
        return [s.process for g in self.groups.values() for s in g.slots.values() if s.process is not None]

    async def describe(self) -> list[dict]:
        """Each group's state and each engine's process, adapters and health (for operators and tests)."""
        groups = []
        for group in self.groups.values():
            engines = []
            for slot in group.slots.values():
                info = {"name": slot.name, "adapters": list(slot.adapters), "pid": None, "alive": False}
                if slot.transport is not None:
                    t = slot.transport
                    info["transport"] = {"kind": t.kind, "master_address": t.master_address,
                                         "reason": t.reason}
                if slot.process is not None:
                    info.update(pid=slot.process.pid, alive=slot.process.alive, url=slot.process.url)
                    try:
                        info["health"] = await self.client.get(slot.name, ROUTE_HEALTH, 5.0)
                    except (EngineUnavailable, EngineRequestError) as exc:
                        info["health"] = {"error": str(exc)}
                engines.append(info)
            groups.append({"base_model": group.base_model, "state": group.state.value, "engines": engines})
        return groups

    # -- sampling ---------------------------------------------------------------------------
    async def sample(self, base_model: str, weights_dir: Path | None, session_key: str,
                     request: SampleRequest) -> SampleResult:
        group = self.groups[base_model]
        self.in_flight += 1
        try:
            prompt = await self._expand(group, request)  # a bad image fails before any engine starts
            async with group.cond:
                await self._ensure_awake(group)
                group.active += 1
            try:
                return await self._sample_once_or_twice(group, weights_dir, session_key, request, prompt)
            finally:
                async with group.cond:
                    group.active -= 1
                    group.cond.notify_all()
        finally:
            self.in_flight -= 1

    async def _expand(self, group: EngineGroup, request: SampleRequest) -> ExpandedInput | None:
        """Image chunks -> placeholder tokens of the model's processor (None for a text-only prompt)."""
        if not request.prompt.has_images:
            return None
        return await asyncio.to_thread(
            expand_input, group.model_dir, request.prompt, model_name=group.base_model
        )

    async def _sample_once_or_twice(self, group: EngineGroup, weights_dir: Path | None, session_key: str,
                                    request: SampleRequest, prompt: ExpandedInput | None) -> SampleResult:
        sampler_id = session_key.rsplit(":", 1)[0]  # a session's requests share an engine
        alive = self._alive(group)
        self._restart_dead_in_background(group, alive)
        slot = group.slots[group.router.pick(sampler_id, alive or None)]
        for attempt in (1, 2):
            try:
                await self._ensure_running(group, slot)
                adapter = await self._ensure_adapter(slot, weights_dir)
                generate = GenerateRequest.from_sample_request(request, adapter, prompt)
                answer = await self.client.generate(slot.name, session_key, generate)
                return answer.to_sample_result()
            except EngineUnavailable as exc:
                logger.warning("engine %s failed during a sample (attempt %d): %s", slot.name, attempt, exc)
                if attempt == 2:
                    raise RuntimeError(f"engine {slot.name} failed twice while sampling: {exc}") from exc
                await self._restart(group, slot)
            except EngineRequestError as exc:
                if 400 <= exc.status < 500:
                    raise UserError(exc.detail) from exc
                raise
        raise AssertionError("unreachable")

    def _alive(self, group: EngineGroup) -> list[str]:
        return [k for k, s in group.slots.items() if s.process is not None and s.process.alive]

    def _restart_dead_in_background(self, group: EngineGroup, alive: list[str]) -> None:
        """Requests skip a dead engine; it comes back on its own, without holding them up."""
        for key, slot in group.slots.items():
            if key not in alive and slot.process is not None and not slot.lock.locked():
                task = asyncio.create_task(self._ensure_running(group, slot))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    # -- weights ----------------------------------------------------------------------------
    async def publish(self, base_model: str, weights_dir: Path, *, start: bool) -> None:
        """Load a new version into every engine of the group (starting them if `start`)."""
        group = self.groups[base_model]
        async with group.cond:
            if group.state is GroupState.ABSENT and not start:
                return
            await self._ensure_awake(group)
            group.active += 1
        try:
            await asyncio.gather(*(self._ensure_adapter(s, weights_dir) for s in group.slots.values()))
        finally:
            async with group.cond:
                group.active -= 1
                group.cond.notify_all()

    def publish_sync(self, base_model: str, weights_dir: Path, *, start: bool) -> None:
        self._call(self.publish(base_model, weights_dir, start=start))

    async def _ensure_adapter(self, slot: EngineSlot, weights_dir: Path | None) -> str | None:
        if weights_dir is None:
            return None
        name = adapter_name(weights_dir)
        async with slot.lock:
            if name in slot.adapters:
                slot.adapters.move_to_end(name)
                return name
            named, spec = await asyncio.to_thread(read_adapter, weights_dir)
            while len(slot.adapters) >= self.settings.max_adapters:
                old = slot.adapters.popitem(last=False)[0]
                await self.client.delete(slot.name, ROUTE_ADAPTER.format(name=old), self.settings.control_timeout_s)
            await self._push(slot, name, named, spec)
            await self.client.post(slot.name, ROUTE_WEIGHTS_FINISH, WeightsFinishRequest(
                version=name, adapter=name).model_dump(), self.settings.control_timeout_s)
            slot.adapters[name] = None
            return name

    async def _push(self, slot: EngineSlot, name: str, named: list, spec: LoraSpec) -> None:
        if slot.transport is None:
            slot.transport = await self._choose_transport(slot)
        if slot.transport.kind == "ipc":
            await self._push_ipc(slot, name, named, spec)
        else:
            await self._push_broadcast(slot, slot.transport, name, named, spec)

    async def _choose_transport(self, slot: EngineSlot) -> TransportChoice:
        if self._trainer is None:
            self._trainer = await asyncio.to_thread(trainer_facts, self.settings.trainer_device)
        health = await self.client.get(slot.name, ROUTE_HEALTH, self.settings.control_timeout_s)
        engine = EngineFacts.from_health(self.client.engines[slot.name], health)
        choice = await asyncio.to_thread(choose_transport, self._trainer, engine)  # may resolve the host
        logger.info("engine %s (%s) receives weights over %s from the trainer (%s): %s", slot.name,
                    engine.device, choice.kind, self._trainer.device, choice.reason)
        return choice

    def _trainer_device(self) -> torch.device:
        assert self._trainer is not None and self._trainer.on_cuda
        return torch.device(self._trainer.device)

    async def _push_ipc(self, slot: EngineSlot, name: str, named: list, spec: LoraSpec) -> None:
        """CUDA IPC: pack the tensors into buffers on the trainer's GPU, post their handles, and keep the
        buffers alive until the engine answered (it copies them before it does)."""
        sender = IpcSender(self._trainer_device())
        try:
            update = await asyncio.to_thread(sender.share, named)
            body = IpcWeightsUpdateRequest(ipc=update, adapter=name, lora=spec)
            await self.client.post(slot.name, ROUTE_WEIGHTS_UPDATE_IPC, body.model_dump(mode="json"),
                                   self.settings.transfer_timeout_s)
        finally:
            sender.release()

    async def _push_broadcast(self, slot: EngineSlot, choice: TransportChoice, name: str, named: list,
                              spec: LoraSpec) -> None:
        """A gloo or NCCL group of the trainer (rank 0) and the engine's workers (ranks 1..), made on the first
        push."""
        assert choice.master_address is not None, "gloo and nccl groups have a master address"
        device = self._trainer_device() if choice.kind == "nccl" else None
        if slot.sender is None:
            init = TransferInit(backend=choice.kind, master_address=choice.master_address,
                                master_port=free_port(choice.master_address),
                                world_size=1 + choice.receivers, rank_offset=1, group_name=f"tx-{slot.name}-{uuid.uuid4().hex[:8]}",
                                timeout_s=self.settings.transfer_timeout_s)
            sender = BroadcastSender(init, device=device)
            await asyncio.gather(
                asyncio.to_thread(sender.connect),
                self.client.post(slot.name, ROUTE_WEIGHTS_INIT, init.model_dump(), self.settings.control_timeout_s),
            )
            slot.sender = sender
        update = plan_update(named)
        body = WeightsUpdateRequest(transfer=update, adapter=name, lora=spec)
        await asyncio.gather(
            self.client.post(slot.name, ROUTE_WEIGHTS_UPDATE, body.model_dump(mode="json"),
                             self.settings.transfer_timeout_s),
            asyncio.to_thread(_send, slot.sender, named, update, device),
        )

    # -- lifecycle --------------------------------------------------------------------------
    async def _ensure_awake(self, group: EngineGroup) -> None:
        """Start (absent) or wake (asleep) the group. Call with `group.cond` held."""
        if group.state is GroupState.ABSENT:
            group.state = GroupState.STARTING
            try:
                await asyncio.gather(*(self._ensure_running(group, s) for s in group.slots.values()))
            except BaseException:
                group.state = GroupState.ABSENT
                raise
        elif group.state is GroupState.ASLEEP:
            await self._control(group, ROUTE_WAKE_UP, WakeUpRequest().model_dump())
        group.state = GroupState.AWAKE

    async def _sleep(self, group: EngineGroup) -> None:
        async with group.cond:
            await group.cond.wait_for(lambda: group.active == 0)
            if group.state is not GroupState.AWAKE:
                return
            level = self.settings.sleep_level
            await self._control(group, ROUTE_SLEEP, SleepRequest(level=level, mode="wait").model_dump())
            if level == 2:
                for slot in group.slots.values():
                    slot.adapters.clear()
            group.state = GroupState.ASLEEP

    def before_training(self) -> None:
        """From the training thread: put colocated engines to sleep before a training pass."""
        if not self.settings.colocate:
            return
        for group in self.groups.values():
            if group.state is GroupState.AWAKE:
                self._call(self._sleep(group))

    async def _control(self, group: EngineGroup, path: str, body: dict) -> None:
        """Fan a control call out; an engine that fails it is restarted (restarted engines are awake)."""
        names = {s.name: s for s in group.slots.values() if s.process is not None}
        results = await self.client.fan_out(path, body, self.settings.control_timeout_s, list(names))
        for name, result in results.items():
            if isinstance(result, Exception):
                logger.warning("engine %s failed %s (%s); restarting it", name, path, result)
                await self._restart(group, names[name])

    async def _ensure_running(self, group: EngineGroup, slot: EngineSlot) -> None:
        async with slot.lock:
            if slot.process is not None and slot.process.alive:
                return
            if slot.process is not None:
                logger.warning("engine %s (pid %d) is dead; restarting it", slot.name, slot.process.pid)
            slot.reset()
            slot.process = await self.launcher.start(slot.name, group.model_dir)
            self.client.engines[slot.name] = slot.process.url

    async def _restart(self, group: EngineGroup, slot: EngineSlot) -> None:
        async with slot.lock:
            if slot.process is not None:
                await self.launcher.stop(slot.process)
        await self._ensure_running(group, slot)

    def _call(self, coro) -> None:
        if self._loop is None:
            raise RuntimeError("EngineManager.bind(loop) was not called")
        asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        for group in self.groups.values():
            for slot in group.slots.values():
                slot.reset()
                if slot.process is not None:
                    await self.launcher.stop(slot.process)
        await self.launcher.close()
        await self.client.aclose()


def _send(sender: BroadcastSender, named: list, update: TransferUpdate, device: torch.device | None) -> None:
    """Broadcast `named`; NCCL sends from the trainer's GPU, so the (cpu) tensors are moved there first."""
    if device is not None:
        named = [(n, t.to(device)) for n, t in named]
    sender.send(named, update)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)[-40:].strip("-") or "model"
