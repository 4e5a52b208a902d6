"""Trainers behind one protocol (`tx.backends.base.TrainingBackend`), chosen by name."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tx.backends.base import TrainingBackend
from tx.config.sections import TrainerSection

if TYPE_CHECKING:
    from tx.multimodal import AudioLimits, ImageLimits


def create_backend(
    models: dict[str, Path],
    trainer: TrainerSection | None = None,
    *,
    image_limits: ImageLimits | None = None,
    audio_limits: AudioLimits | None = None,
    ray_options: Callable[[int], dict[str, Any]] | None = None,
    threads: int = 0,
) -> TrainingBackend:
    """Build the backend `trainer.backend` names, importing its heavy library only now, on `trainer.device`;
    with `trainer.workers` > 1 the trainer runs on that many worker processes (torch only), Ray actors placed
    by `ray_options(rank)` if given. "jax" takes the micro-batch budget only. `threads`: the trainer's CPU
    threads at start (0: torch's default), split over local workers."""
    trainer = trainer or TrainerSection()
    if trainer.backend == "torch" and trainer.workers > 1:
        from tx.backends.torch.workers import create_workers_backend

        per_worker = max(1, threads // trainer.workers) if threads and ray_options is None else 0
        return create_workers_backend(models, trainer.workers, device=trainer.device, image_limits=image_limits,
                                      audio_limits=audio_limits, trainer=trainer, ray_options=ray_options, threads=per_worker)
    if trainer.backend == "torch":
        from tx.backends.torch.backend import TorchBackend

        return TorchBackend(models, device=trainer.device, image_limits=image_limits, settings=trainer,
                            audio_limits=audio_limits)
    return _jax_backend(models, trainer)


def _jax_backend(models: dict[str, Path], trainer: TrainerSection) -> TrainingBackend:
    """The JAX trainer (the [jax] extra). It takes the micro-batch budget; the torch trainer's other settings
    are refused rather than ignored."""
    missing = [module for module in ("jax", "optax") if importlib.util.find_spec(module) is None]
    if missing:
        raise ValueError(f"--backend jax needs the [jax] extra ({', '.join(missing)} not installed): "
                         "pip install 'tx[jax]'")
    unsupported = {
        "--trainer-workers > 1 (jax uses every local device in one process)": trainer.workers > 1,
        "--train-dtype other than float32": trainer.dtype not in (None, "float32"),
        "--gradient-checkpointing": bool(trainer.gradient_checkpointing),
        "--train-max-sequence-tokens": trainer.max_sequence_tokens is not None,
    }
    refused = [flag for flag, given in unsupported.items() if given]
    if refused:
        raise ValueError(f"--backend jax does not support {', '.join(refused)}")
    from tx.backends.jax.backend import JaxBackend

    return JaxBackend(models, device=trainer.device, micro_batch_tokens=trainer.micro_batch_tokens)
