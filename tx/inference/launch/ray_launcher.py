"""`RayLauncher`: engines (embedded or vLLM) as Ray actors in one placement group (the `Launcher` seam).

Design / who owns what:
- `connect()` joins a Ray cluster (`address`) or starts a local one (tests, one machine). The
  launcher connects lazily on its first `start` if nothing did before.
- The launcher owns one placement group, built from a `PlacementSpec` on the first `start` (after
  checking the cluster can hold it). Each engine name gets a slot (bundle) the first time it starts
  and keeps it across restarts; trainer workers get their options from `trainer_options`.
- Named nodes: the spec's node labels (`--trainer-node-label`, `--engine-node-label`) become each bundle's
  label selector, so Ray puts the trainer's bundles and the engines' on the nodes that carry them.
- One `EngineActor` per engine; it owns the engine process, of the kind the launcher was built for
  (`engine="embedded"` or `"vllm"`, with that engine's options, e.g. vLLM's dtype and extra args).
  A vLLM engine wider than one GPU (tensor parallel) gets the GPUs of all its bundles in
  CUDA_VISIBLE_DEVICES (`bundle_gpus`) and runs its TP workers itself; its bundles must share a node. `start(name)` replaces any previous actor
  of that name (the manager restarts a dead engine by starting it again). `stop` ends the engine
  gracefully, then kills the actor. `close` kills what is left and removes the placement group.
- The manager talks to engines over HTTP only, as with local processes; Ray places and supervises.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tx.config.names import EngineKindName
from tx.inference.engines.kinds import engine_kind
from tx.inference.launch.process import STARTUP_GRACE_S
from tx.inference.launch.ray_actor import EngineActor
from tx.ray import connect, import_ray
from tx.ray.placement import ActorPlacement, PlacementSpec

ray = import_ray()
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

logger = logging.getLogger(__name__)


@functools.cache
def _remote_engine_actor():
    return ray.remote(EngineActor)


def ray_options(placement: ActorPlacement, group: PlacementGroup) -> dict[str, Any]:
    """Ray actor options for `placement` inside `group`."""
    strategy = PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=placement.bundle_index,
        placement_group_capture_child_tasks=True,
    )
    return {"num_gpus": placement.num_gpus, "num_cpus": placement.num_cpus, "scheduling_strategy": strategy}


@ray.remote(num_cpus=0)
def _gpu_ids() -> tuple[str, list[str]]:
    return ray.get_runtime_context().get_node_id(), [str(i) for i in ray.get_gpu_ids()]


async def bundle_gpus(placement: ActorPlacement, group: PlacementGroup, spec: PlacementSpec) -> dict[str, str]:
    """{"CUDA_VISIBLE_DEVICES": the GPUs of every bundle of a multi-bundle (TP) engine}, found by a task
    in each bundle claiming what the engine's share would be; {} for a one-bundle engine or without GPUs.
    ValueError if the bundles are on different nodes (one engine's TP workers run on one node)."""
    if len(placement.bundle_indices) < 2 or not spec.use_gpu:
        return {}
    claim = spec.claim()[0]
    refs = [_gpu_ids.options(num_gpus=claim, scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=i)).remote() for i in placement.bundle_indices]
    found = await asyncio.gather(*refs)
    if len({node for node, _ in found}) > 1:
        raise ValueError(f"the bundles {placement.bundle_indices} of one tensor-parallel engine are on different "
                         "nodes; use strategy STRICT_PACK or nodes with tensor_parallel_size GPUs each")
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpu for _, ids in found for gpu in ids)}


@dataclass
class RayEngine:
    """An engine running in a Ray actor (an `EngineHandle`)."""

    name: str
    url: str
    actor: Any  # ray.actor.ActorHandle
    exited: Any  # ray.ObjectRef of EngineActor.wait_exit: ready once the engine or the actor is gone
    engine_pid: int
    node_ip: str
    bundle_index: int
    run_dir: str | None = None  # the engine's working directory on its node (log, ready file)
    cuda_visible_devices: str | None = None

    @property
    def alive(self) -> bool:
        ready, _ = ray.wait([self.exited], timeout=0)
        return not ready

    @property
    def pid(self) -> int:
        """The engine process's pid on its node (`node_ip`)."""
        return self.engine_pid


class RayLauncher:
    """Starts engines (embedded or vLLM) as Ray actors placed by a `PlacementSpec`."""

    def __init__(self, placement: PlacementSpec, secret: str, *, engine: EngineKindName = "embedded",
                 address: str | None = None, work_dir: Path | None = None, host: str | None = None,
                 max_adapters: int = 8, log_level: str = "info", startup_timeout_s: float | None = None,
                 placement_timeout_s: float = 60.0, stop_timeout_s: float = 10.0, **engine_options: Any) -> None:
        """`engine_options`: more fields of the engine's config (embedded: dtype, num_threads; vLLM: dtype,
        max_lora_rank, gpu_memory_utilization, extra_args such as `--tensor-parallel-size`, ...).
        `startup_timeout_s`: the kind's default unless given."""
        kind = engine_kind(engine)
        kind.require(engine_options)  # a missing or unsupported vLLM fails at server start, not at a sample
        if placement.tensor_parallel_size != 1 and not kind.tensor_parallel:
            raise ValueError(
                f"the {kind.label} runs on one device; tensor_parallel_size > 1 needs the vLLM engine"
            )
        self.kind = kind
        self.engine_options = engine_options
        self.placement = placement
        self.secret = secret
        self.address = address
        self.work_dir = work_dir  # on the engine's node; None: a temporary directory there
        self.host = host  # None: loopback on the server's node, the node's address elsewhere
        self.max_adapters = max_adapters
        self.log_level = log_level
        self.startup_timeout_s = startup_timeout_s or kind.startup_timeout_s
        self.placement_timeout_s = placement_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.group: PlacementGroup | None = None
        self._group_lock = asyncio.Lock()
        self._slots: dict[str, int] = {}  # engine name -> engine index (bundle) in the placement
        self._engines: dict[str, RayEngine] = {}

    async def start(self, name: str, model_dir: Path) -> RayEngine:
        group = await self.placement_group()
        previous = self._engines.pop(name, None)
        if previous is not None:  # a dead engine being restarted: make sure its actor is gone
            ray.kill(previous.actor, no_restart=True)
        placement = self.placement.engine(self._slot(name))
        fields = {
            "model_dir": str(model_dir), "cluster_secret": self.secret, "host": self.host, "port": 0,
            "max_adapters": self.max_adapters, "log_level": self.log_level, **self.engine_options,
        }
        env = await bundle_gpus(placement, group, self.placement)
        actor_class = _remote_engine_actor().options(max_restarts=0, **ray_options(placement, group))
        here = ray.get_runtime_context().get_node_id()
        actor = actor_class.remote(name, self.kind.name, fields, env, _str(self.work_dir), here)
        try:
            ready = actor.ready.remote(self.startup_timeout_s)
            info = await asyncio.wait_for(ready, self.startup_timeout_s + STARTUP_GRACE_S + 30)
        except Exception as exc:
            ray.kill(actor, no_restart=True)  # pyright: ignore[reportArgumentType]  (ray types .remote() as a proxy)
            cause = getattr(exc, "cause", None) or exc  # a RayTaskError wraps what the actor raised
            raise RuntimeError(f"engine {name} failed to start as a Ray actor: {cause}") from exc
        engine = RayEngine(
            name=name, url=info["url"], actor=actor, exited=actor.wait_exit.remote(), engine_pid=info["pid"],
            node_ip=info["node_ip"], bundle_index=placement.bundle_index, run_dir=info["run_dir"],
            cuda_visible_devices=info["cuda_visible_devices"],
        )
        self._engines[name] = engine
        logger.info("engine %s (pid %d on %s, bundle %d) serving %s at %s", name, engine.pid, engine.node_ip,
                    engine.bundle_index, model_dir, engine.url)
        return engine

    async def stop(self, engine) -> None:
        assert isinstance(engine, RayEngine)
        if self._engines.get(engine.name) is engine:
            del self._engines[engine.name]
        if engine.alive:
            try:
                stopped = engine.actor.stop.remote(self.stop_timeout_s)
                await asyncio.wait_for(stopped, self.stop_timeout_s + 10)
            except Exception as exc:  # noqa: BLE001 - the actor is killed below either way
                logger.warning("engine %s did not stop cleanly: %s", engine.name, exc)
        ray.kill(engine.actor, no_restart=True)

    async def close(self) -> None:
        """Stop every engine this launcher started and remove its placement group."""
        for engine in list(self._engines.values()):
            await self.stop(engine)
        if self.group is not None:
            remove_placement_group(self.group)
            self.group = None

    async def placement_group(self) -> PlacementGroup:
        """The launcher's placement group, created and ready (on first use)."""
        async with self._group_lock:
            if self.group is None:
                connect(self.address)
                self.placement.check_fits(ray.cluster_resources())
                selectors = self.placement.label_selectors()  # None (Ray's default) unless nodes are named
                group = placement_group(self.placement.bundles(), strategy=self.placement.strategy,
                                        bundle_label_selector=selectors)  # pyright: ignore[reportArgumentType]
                try:
                    await asyncio.wait_for(group.ready(), self.placement_timeout_s)
                except TimeoutError:
                    remove_placement_group(group)
                    raise RuntimeError(
                        f"the placement group ({len(self.placement.bundles())} bundles of "
                        f"{self.placement.bundles()[0]}, node labels {selectors}) was not ready after "
                        f"{self.placement_timeout_s} s; the cluster has {ray.available_resources()} available"
                    ) from None
                self.group = group
            return self.group

    async def trainer_options(self, rank: int) -> dict[str, Any]:
        """Ray actor options that place trainer worker `rank` in this launcher's group."""
        return ray_options(self.placement.trainer(rank), await self.placement_group())

    def _slot(self, name: str) -> int:
        if name not in self._slots:
            if len(self._slots) >= self.placement.num_engines:
                raise ValueError(
                    f"cannot place engine {name}: the placement holds {self.placement.num_engines} engines "
                    f"({', '.join(self._slots)}); raise num_engines"
                )
            self._slots[name] = len(self._slots)
        return self._slots[name]


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)
