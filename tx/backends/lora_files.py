"""The checkpoint files of a trainer whose runs' weights are PEFT-named LoRA tensors, written in one place.

`LoraFilesBackend` gives a backend `read_state_config` and `save_sampler_weights` (the formats of
`tx/backends/torch/checkpoint.py`) from two things it has anyway: `_run` (the run's base model and LoRA
config) and `iter_trainable_weights` (its LoRA tensors by PEFT file name). The JAX trainer and the trainer
workers' API side use it; the in-process torch trainer writes its PEFT model's own state dict and config.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Protocol

from tx.backends.base import TrainingBackend
from tx.backends.torch import checkpoint
from tx.backends.torch.lora import peft_config_for
from tx.backends.torch.peft_compat import note_plain_peft
from tx.models.lora_targets import structure_of
from tx.types import LoraConfig, UserError


class RunConfig(Protocol):
    """What a run says of its model."""

    @property
    def base_model(self) -> str: ...

    @property
    def lora(self) -> LoraConfig: ...


def check_compatible(run: RunConfig, base_model: str, lora: LoraConfig, directory: Path) -> None:
    """UserError unless the checkpoint in `directory` (for `base_model`, with `lora`) fits `run` (every backend)."""
    if base_model != run.base_model:
        raise UserError(f"checkpoint {directory} is for base model {base_model!r}, not {run.base_model!r}")
    mine = (run.lora.rank, run.lora.train_attn, run.lora.train_mlp, run.lora.train_unembed)
    theirs = (lora.rank, lora.train_attn, lora.train_mlp, lora.train_unembed)
    if mine != theirs:
        raise UserError(f"checkpoint {directory} has LoRA config {lora}, which does not fit {run.lora}")


class LoraFilesBackend(TrainingBackend):
    @abstractmethod
    def _run(self, model_id: str) -> RunConfig:
        """The run `model_id`; NotFoundError (or the backend's own error) when there is none."""

    def read_state_config(self, directory: Path) -> tuple[str, LoraConfig]:
        return checkpoint.read_state_config(directory)

    _paths: dict[str, Path]
    """Each served base model's directory (the subclass sets it)."""

    def save_sampler_weights(self, model_id: str, directory: Path) -> None:
        run = self._run(model_id)
        weights = dict(self.iter_trainable_weights(model_id))
        config = peft_config_for(run.lora, structure_of(self._paths[run.base_model]), held=weights)
        checkpoint.write_sampler_weights(directory, run.base_model, config, weights)
        note_plain_peft(directory, self._paths[run.base_model], run.base_model, config, weights)
