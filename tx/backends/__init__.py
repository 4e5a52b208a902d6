"""Trainers behind one protocol (`tx.backends.base.TrainingBackend`), chosen by name."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tx.backends.base import TrainingBackend

if TYPE_CHECKING:
    from tx.backends.torch.settings import TrainerSettings
    from tx.multimodal import ImageLimits


def create_backend(
    name: str,
    models: dict[str, Path],
    *,
    device: str = "auto",
    image_limits: ImageLimits | None = None,
    workers: int = 1,
    trainer: TrainerSettings | None = None,
    ray_options: Callable[[int], dict[str, Any]] | None = None,
) -> TrainingBackend:
    """Build the backend called `name`, importing its heavy library only now; with `workers` > 1 the trainer
    runs on that many worker processes (torch only), Ray actors placed by `ray_options(rank)` if given.
    `trainer`: micro-batch budget, dtype and checkpointing of the torch trainer (device defaults when None)."""
    if name == "torch" and workers > 1:
        from tx.backends.torch.workers import create_workers_backend

        return create_workers_backend(models, workers, device=device, image_limits=image_limits,
                                      trainer=trainer, ray_options=ray_options)
    if name == "torch":
        from tx.backends.torch.backend import TorchBackend

        return TorchBackend(models, device=device, image_limits=image_limits, settings=trainer)
    if name == "jax":
        missing = [module for module in ("jax", "optax") if importlib.util.find_spec(module) is None]
        if missing:
            raise ValueError(f"--backend jax needs the [jax] extra ({', '.join(missing)} not installed): "
                             "pip install 'tx[jax]'")
        from tx.backends.jax.backend import JaxBackend

        return JaxBackend(models, device=device)
    raise ValueError(f"unknown training backend {name!r}: choose 'torch' or 'jax'")
