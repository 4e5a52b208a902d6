"""The publisher: weight versions into engines, over the transport each engine takes, with eviction.

Design / who owns what:
- The publisher is the one owner of what each engine process holds (`EngineWeights`: its transport, its
  collective group, the adapters loaded and the requests using each). Others read it (`held`);
  the supervisor tells it when a process is replaced (`forget`), the lifecycle when a level-2 sleep dropped the
  adapters (`forget_adapters`).
- A weight version (`versions.py`) is a LoRA adapter named `v<number>`. An engine loads a version on first use
  (pushed from the trainer's tensors, never read back from disk) and keeps the most recent `max_adapters`.
- An adapter a request is generating with (`holding`) is never unloaded: eviction takes the least recently used
  idle one, and waits for one to become idle when all are in use.
- A run's inflight versions share one adapter name: a newer one is pushed over the older in place (the engine
  swaps the weights between decode steps; requests generating with it go on, on the new weights).
- Weights travel over the transport `weight_sync.transport.choose_transport` picks per engine, from the
  trainer's device (`EngineSettings.trainer_device`) and what the engine's `/health` reports: CUDA IPC into an
  engine on the trainer's own GPU, NCCL to one on another GPU, gloo when either side is on cpu (the tensors
  are read on cpu; NCCL and IPC move them to the trainer's GPU first). The choice is made once per engine
  process; a restarted engine is asked again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import get_args

import torch

from tx.config.names import VllmLoraRank
from tx.inference.manager.client import InferenceClient
from tx.inference.manager.groups import EngineSettings, EngineSlot
from tx.inference.manager.versions import NamedTensors, WeightVersion
from tx.inference.protocol import (
    ROUTE_ADAPTER,
    ROUTE_HEALTH,
    ROUTE_WEIGHTS_FINISH,
    ROUTE_WEIGHTS_INIT,
    ROUTE_WEIGHTS_UPDATE,
    ROUTE_WEIGHTS_UPDATE_IPC,
    IpcWeightsUpdateRequest,
    LoraSpec,
    WeightsFinishRequest,
    WeightsUpdateRequest,
)
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
from tx.types import UserError

logger = logging.getLogger(__name__)


@dataclass
class EngineWeights:
    """What one engine (its slot) holds, as the publisher knows it. `forget` resets the first three with the
    process; the requests in use and their condition belong to the slot and outlive a restart."""

    freed: asyncio.Condition  # on the slot's lock: an adapter stopped being in use
    transport: TransportChoice | None = None  # chosen on the first push to this engine process
    sender: BroadcastSender | None = None  # the collective group (gloo, nccl); None for ipc
    max_lora_rank: int | None = None  # the largest LoRA rank it takes (its /health, read with the transport)
    adapters: OrderedDict[str, int] = field(default_factory=OrderedDict)  # loaded -> its version number, LRU first
    in_use: Counter[str] = field(default_factory=Counter)  # adapter -> requests generating with it now


class Publisher:
    def __init__(self, settings: EngineSettings, client: InferenceClient) -> None:
        self.settings = settings
        self.client = client
        self._trainer: TrainerFacts | None = None
        self._engines: dict[str, EngineWeights] = {}  # slot name -> what its process holds
        self.pushed_bytes = 0  # weight bytes sent to engines, and the seconds the pushes took (for /metrics)
        self.push_seconds = 0.0

    def held(self, slot: EngineSlot) -> EngineWeights:
        """What the slot's engine holds (to read: only the publisher writes it)."""
        held = self._engines.get(slot.name)
        if held is None:
            held = self._engines[slot.name] = EngineWeights(freed=asyncio.Condition(slot.lock))
        return held

    def forget(self, slot: EngineSlot) -> None:
        """The slot's process is new (started, restarted, or an external engine that rejoined): it holds no
        adapter, and its transport and collective group are to be chosen again."""
        held = self.held(slot)
        if held.sender is not None:
            held.sender.close()
        held.sender, held.transport, held.max_lora_rank, held.adapters = None, None, None, OrderedDict()

    def forget_adapters(self, slot: EngineSlot) -> None:
        """The engine dropped every adapter (a level-2 sleep); its transfer group stays."""
        self.held(slot).adapters.clear()

    @contextlib.asynccontextmanager
    async def holding(self, slot: EngineSlot, version: WeightVersion | None) -> AsyncIterator[str | None]:
        """The adapter serving `version` on this engine (None: the base model), kept loaded while held."""
        name = await self.ensure_adapter(slot, version, hold=True)
        try:
            yield name
        finally:
            if name is not None:
                held = self.held(slot)
                async with held.freed:
                    held.in_use[name] -= 1
                    if held.in_use[name] <= 0:
                        del held.in_use[name]
                    held.freed.notify_all()

    async def ensure_adapter(self, slot: EngineSlot, version: WeightVersion | None, hold: bool = False) -> str | None:
        """The adapter serving `version` on this engine, pushed there first if it is not loaded (and counted in
        use if `hold`: the caller then releases it as `holding` does)."""
        if version is None:
            return None
        name, held = version.adapter, self.held(slot)
        async with slot.lock:
            loaded = held.adapters.get(name)
            if loaded is None:
                await self._load(slot, held, version)
            elif loaded < version.number:  # an inflight adapter holding older weights: replaced in place
                await self._push_version(slot, held, version)
            held.adapters.move_to_end(name)
            if hold:
                held.in_use[name] += 1
            return name

    async def _load(self, slot: EngineSlot, held: EngineWeights, version: WeightVersion) -> None:
        """Push `version` into the engine, unloading idle adapters to make room. Call with `slot.lock` held."""
        while len(held.adapters) >= self.settings.max_adapters:
            idle = next((a for a in held.adapters if not held.in_use[a]), None)
            if idle is None:  # every loaded adapter is generating: wait for one to finish
                await held.freed.wait()
                if version.adapter in held.adapters:
                    return
                continue
            del held.adapters[idle]
            await self.client.delete(slot.name, ROUTE_ADAPTER.format(name=idle), self.settings.control_timeout_s)
        await self._push_version(slot, held, version)

    async def _push_version(self, slot: EngineSlot, held: EngineWeights, version: WeightVersion) -> None:
        name = version.adapter
        await self.push(slot, name, version.named, version.spec)
        await self.client.post(slot.name, ROUTE_WEIGHTS_FINISH, WeightsFinishRequest(
            version=f"v{version.number}", adapter=name).model_dump(), self.settings.control_timeout_s)
        held.adapters[name] = version.number

    async def push(self, slot: EngineSlot, name: str, named: NamedTensors, spec: LoraSpec) -> None:
        held = self.held(slot)
        if held.transport is None:
            held.transport, held.max_lora_rank = await self._meet(slot)
        if held.max_lora_rank is not None and spec.r > held.max_lora_rank:
            raise UserError(_over_max_rank(spec.r, held.max_lora_rank))
        start = time.perf_counter()
        if held.transport.kind == "ipc":
            await self._push_ipc(slot, name, named, spec)
        else:
            await self._push_broadcast(slot, held, name, named, spec)
        self.push_seconds += time.perf_counter() - start
        self.pushed_bytes += sum(tensor.numel() * tensor.element_size() for _, tensor in named)

    async def _meet(self, slot: EngineSlot) -> tuple[TransportChoice, int | None]:
        """From a new engine process's /health: the transport it takes weights over, and its largest rank."""
        if self._trainer is None:
            self._trainer = await asyncio.to_thread(trainer_facts, self.settings.trainer_device)
        health = await self.client.get(slot.name, ROUTE_HEALTH, self.settings.control_timeout_s)
        engine = EngineFacts.from_health(self.client.engines[slot.name], health)
        choice = await asyncio.to_thread(choose_transport, self._trainer, engine)  # may resolve the host
        logger.info("engine %s (%s) receives weights over %s from the trainer (%s): %s", slot.name,
                    engine.device, choice.kind, self._trainer.device, choice.reason)
        return choice, health.get("max_lora_rank")

    def _trainer_device(self) -> torch.device:
        assert self._trainer is not None and self._trainer.on_cuda
        return torch.device(self._trainer.device)

    async def _push_ipc(self, slot: EngineSlot, name: str, named: NamedTensors, spec: LoraSpec) -> None:
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

    async def _push_broadcast(self, slot: EngineSlot, held: EngineWeights, name: str, named: NamedTensors,
                              spec: LoraSpec) -> None:
        """A gloo or NCCL group of the trainer (rank 0) and the engine's workers (ranks 1..), made on the first
        push."""
        choice = held.transport
        assert choice is not None and choice.kind != "ipc" and choice.master_address is not None, \
            "a gloo or nccl group, with its address"
        device = self._trainer_device() if choice.kind == "nccl" else None
        if held.sender is None:
            init = TransferInit(backend=choice.kind, master_address=choice.master_address,
                                master_port=free_port(choice.master_address), world_size=1 + choice.receivers,
                                rank_offset=1, group_name=f"tx-{slot.name}-{uuid.uuid4().hex[:8]}",
                                timeout_s=self.settings.transfer_timeout_s)
            sender = BroadcastSender(init, device=device)
            await asyncio.gather(
                asyncio.to_thread(sender.connect),
                self.client.post(slot.name, ROUTE_WEIGHTS_INIT, init.model_dump(), self.settings.control_timeout_s),
            )
            held.sender = sender
        sender, update = held.sender, plan_update(named)
        body = WeightsUpdateRequest(transfer=update, adapter=name, lora=spec)
        posting = asyncio.ensure_future(self.client.post(
            slot.name, ROUTE_WEIGHTS_UPDATE, body.model_dump(mode="json"), self.settings.transfer_timeout_s))
        sending = asyncio.ensure_future(asyncio.to_thread(_send, sender, named, update, device))
        try:
            await asyncio.gather(posting, sending)
        except BaseException:
            # The engine refused the push or failed in it, or the broadcast failed: the two sides are out of
            # step, so the next push makes a new group. A broadcast the engine never joined ends at its
            # timeout; the sender closes then (its buffers may still be on the wire until that moment).
            held.sender = None
            posting.add_done_callback(_retrieved)
            sending.add_done_callback(lambda done: (_retrieved(done), sender.close()))
            raise


def _over_max_rank(rank: int, largest: int) -> str:
    """Why a run of LoRA rank `rank` cannot sample from engines that take at most `largest`, and what to do."""
    fits = [r for r in get_args(VllmLoraRank) if r >= rank]
    remedy = (f"start tx serve with --engine-max-lora-rank {fits[0]} (external engines: tx engine serve "
              f"--max-lora-rank {fits[0]}) to sample from it" if fits
              else f"vLLM takes ranks up to {get_args(VllmLoraRank)[-1]}")
    return f"this run's LoRA rank {rank} is over the largest its engines take ({largest}): it trains, but {remedy}"


def _retrieved(future: asyncio.Future) -> None:
    """Marks a failed half of a push as seen (the push raised the first failure)."""
    if not future.cancelled():
        future.exception()


def _send(sender: BroadcastSender, named: NamedTensors, update: TransferUpdate, device: torch.device | None) -> None:
    """Broadcast `named`; NCCL sends from the trainer's GPU, so the (cpu) tensors are moved there first."""
    if device is not None:
        named = [(n, t.to(device)) for n, t in named]
    sender.send(named, update)
