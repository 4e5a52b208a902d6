"""The launcher the settings ask for: engines as local child processes, or as Ray actors with `ray_address`.

`build_launcher` reads the engines' section, and of the trainer's section what engines follow: its dtype
(the engines' default), its worker count and node labels (trainer ranks share the Ray placement group with the
engines).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from tx.config.sections import EngineSection, TrainerSection
from tx.cpu import cpu_ids
from tx.inference.engines.kinds import engine_kind
from tx.inference.launch.base import Launcher
from tx.inference.launch.local import LocalLauncher, engine_env


def build_launcher(engines: EngineSection, trainer: TrainerSection, *, work_dir: Path, num_engines: int,
                   colocate: bool, model_dirs: list[Path] | None = None,
                   threads: int | None = None) -> Launcher:
    """`num_engines`: every engine tx starts, over all base models (the Ray placement group's size);
    `colocate`: engines share the trainer's accelerator. The engines' secret is the external engines' when
    given (so that one client talks to all), else a new one. `model_dirs`: the models tx starts engines for
    (a local launcher's standby imports their classes, with `engines.standby`). `threads`: each local engine's
    CPU threads (the machine's budget, `tx/cpu.py`; None: all; Ray actors get their placement's CPUs)."""
    secret = engines.secret_value() or secrets.token_urlsafe(32)
    options = engine_options(engines, trainer)
    if engines.ray_address is None:
        kind = engine_kind(engines.kind)
        env: dict[str, str] = {}
        if threads is not None:
            env = {k: v for k, v in engine_env(kind, threads, cpu_ids()).items()
                   if k not in os.environ}  # the operator's own setting wins
            if kind.name == "embedded":
                options["num_threads"] = threads
        standby_for = model_dirs if engines.standby and num_engines and model_dirs else None
        return LocalLauncher(work_dir, secret, kind=kind, max_adapters=engines.max_adapters,
                             standby_for=standby_for, env=env, **options)
    from tx.inference.launch.ray_launcher import RayLauncher
    from tx.ray import connect, import_ray
    from tx.ray.placement import PlacementSpec

    address = None if engines.ray_address == "local" else engines.ray_address
    connect(address)
    ray = import_ray()
    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    spec = PlacementSpec(num_engines=num_engines, tensor_parallel_size=engines.tensor_parallel_size,
                         num_trainer_workers=trainer.workers if trainer.workers > 1 else 0,
                         colocate=colocate and use_gpu, use_gpu=use_gpu,
                         trainer_labels=trainer.node_labels, engine_labels=engines.node_labels)
    spec.check_labels(node["Labels"] for node in ray.nodes() if node["Alive"])  # a missing node: refused now
    return RayLauncher(spec, secret, engine=engines.kind, address=address, work_dir=work_dir,
                       max_adapters=engines.max_adapters, **options)


def engine_options(engines: EngineSection, trainer: TrainerSection) -> dict[str, Any]:
    """The fields of the engine kind's config that the settings choose (`engines/kinds.py` lists each kind's)."""
    options: dict[str, Any] = {"dtype": engines.resolved_dtype(trainer)}
    if engines.kind == "vllm":
        options.update(gpu_memory_utilization=engines.memory_share, max_lora_rank=engines.max_lora_rank,
                       extra_args=["--tensor-parallel-size", str(engines.tensor_parallel_size)],
                       vllm_python=engines.vllm_python)
    elif trainer.attn_implementation is not None:  # the embedded engine runs the trainer's attention
        options["attn_implementation"] = trainer.attn_implementation
    return options
