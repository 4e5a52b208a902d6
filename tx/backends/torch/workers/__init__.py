"""The torch trainer on N worker processes in one torch.distributed group, local or on Ray.

`create_workers_backend` builds the API process's side (`backend.WorkersBackend`); each worker runs
`worker.py` and hosts runs on a base held whole (`replicated.py`) or sharded with FSDP2 (`sharded.py`), as
`policy.py` decides; `group.py` starts local worker processes and `ray_workers.py` Ray actors.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tx.backends.torch.workers.backend import WorkersBackend
from tx.backends.torch.workers.group import LocalWorkers, WorkerGroup, start_group
from tx.backends.torch.workers.messages import WorkerSpec
from tx.config.sections import TrainerSection
from tx.multimodal import AudioLimits, ImageLimits


def create_workers_backend(
    models: dict[str, Path],
    size: int,
    *,
    device: str = "auto",
    image_limits: ImageLimits | None = None,
    audio_limits: AudioLimits | None = None,
    threads: int = 0,
    trainer: TrainerSection | None = None,
    ray_options: Callable[[int], dict[str, Any]] | None = None,
) -> WorkersBackend:
    """`size` local worker processes (each with an equal share of the cores unless `threads` is set), or with
    `ray_options` (rank -> Ray actor options) `size` Ray actors (each with the CPUs its placement claims).
    `trainer`: the torch trainer's settings, which every worker applies."""
    trainer = trainer or TrainerSection()
    spec = WorkerSpec(
        world_size=size,
        models={name: str(path) for name, path in models.items()},
        device=device,
        threads=threads,
        trainer=trainer,
    )
    if ray_options is not None:
        from tx.backends.torch.workers.ray_workers import RayWorkers

        def start() -> WorkerGroup:
            workers = RayWorkers(spec, ray_options)
            return start_group(workers, workers.host)
    else:
        local = spec.model_copy(update={"threads": threads or max(1, (os.cpu_count() or 1) // size)})

        def start() -> WorkerGroup:
            return start_group(LocalWorkers(local), "127.0.0.1")

    return WorkersBackend(
        models, start, image_limits=image_limits, audio_limits=audio_limits, max_sequence_tokens=trainer.max_sequence_tokens,
        shares_cores=ray_options is None,
    )
