"""The seam between the core and a trainer.

Design / who owns what:

- The core (`tx/core/`) owns ordering, futures, persistence and checkpoint paths. It calls a
  backend from ONE training thread, one call at a time, so a backend needs no locking of its own.
  The exceptions are the checks at submission (`base_model_info`, `check_batch`, `check_custom_loss`),
  which run in request threads: they read only a model's config facts, never a run's state.
- A backend owns the models on its accelerator: one base model loaded once, shared by every
  LoRA run (an "adapter") created on it, each run with its own optimizer and gradients.
- Gradients accumulate across `forward_backward` calls until `optim_step`; `forward_only`
  requests never touch them.
- Checkpoint directories are chosen by the core; the backend only writes into (or reads from)
  the directory it is given, which the core then moves into place atomically.
- Every method raises `tx.types.UserError` for bad input (unknown loss, misshapen inputs,
  tokens outside the vocabulary, sequences that are too long) with a message a user can act on.
  `check_batch` refuses such a batch before it is queued (`tx/backends/datums.py` holds the rules,
  which `forward_backward` applies again to the datums as the model sees them).

Backends are chosen by name through `tx.backends.create_backend`, which imports the heavy
library (torch, jax) only when that backend is asked for.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tx.backends import datums
from tx.backends.datums import DatumRules
from tx.optimizers import ADAMW, AdamParams, OptimizerConfig, OptimParams, check_params_fit
from tx.types import (
    BaseLogprobs,
    BaseModelInfo,
    CustomLoss,
    ForwardBackwardInput,
    ForwardBackwardResult,
    LoraConfig,
    OptimStepResult,
    UserError,
)


def adamw_only(optimizer: OptimizerConfig, trainer: str) -> None:
    """For a trainer that has AdamW only: a UserError, at create_model, for any other optimizer."""
    if optimizer.kind != "adamw":
        raise UserError(f"the {optimizer.kind} optimizer does not run on {trainer}: it runs on the in-process "
                        "torch trainer (tx serve --backend torch --trainer-workers 1); use AdamOptimizerConfig here")


def adam_params(params: OptimParams) -> AdamParams:
    """The AdamParams of a step on an AdamW-only trainer (its runs are all AdamW)."""
    check_params_fit(ADAMW, params)
    assert isinstance(params, AdamParams)
    return params


class TrainingBackend(ABC):
    def training_device(self) -> str:
        """Where training runs: "cpu", "cuda" (the current GPU) or "cuda:N". The engine manager picks the
        weight transport from it (gloo, NCCL, CUDA IPC)."""
        return "cpu"

    def close(self) -> None:
        """Release what the backend started (worker processes); called once when the server stops."""

    def use_threads(self, threads: int) -> None:
        """The CPU threads training passes may use from now on (the trainer's share of the machine's budget,
        `tx/cpu.py`). Called on the training thread, before a pass, when the share changes; a backend whose
        thread pools cannot change keeps its own."""

    @abstractmethod
    def base_model_info(self, base_model: str) -> BaseModelInfo:
        """Info on a served base model; NotFoundError if it is not served."""

    @abstractmethod
    def served_models(self) -> list[BaseModelInfo]:
        """Every base model this backend serves."""

    def base_logprobs(self, base_model: str, sequences: Sequence[Sequence[int]]) -> BaseLogprobs | None:
        """The base model's forward of each sequence (one row, no adapter): what an engine's self-check compares
        its prompt logprobs with. Called on the training thread. None: this trainer cannot (nothing is checked)."""
        return None

    @abstractmethod
    def create_model(self, model_id: str, base_model: str, lora: LoraConfig,
                     optimizer: OptimizerConfig = ADAMW) -> None:
        """Create a fresh LoRA run `model_id` on `base_model` (seeded by `lora.seed`), trained with `optimizer`
        (UserError for one this backend does not have, naming where it runs)."""

    @abstractmethod
    def has_model(self, model_id: str) -> bool:
        """Whether `model_id` is loaded in this process."""

    @abstractmethod
    def delete_model(self, model_id: str) -> None:
        """Drop a run's adapter, gradients and optimizer state."""

    @abstractmethod
    def forward_backward(self, model_id: str, batch: ForwardBackwardInput) -> ForwardBackwardResult:
        """Run the loss on every datum; accumulate gradients unless `batch.forward_only`."""

    def forward_backward_many(
        self, calls: Sequence[tuple[str, ForwardBackwardInput]]
    ) -> list[ForwardBackwardResult | Exception]:
        """Several runs' forward_backward (or forward) calls at once: each call's result, or the error of its own
        call, in order. Each run's losses, gradients and outputs are its own, as if it ran alone. This default
        runs them in turns; a backend that trains runs on one base model in the same pass overrides it."""
        results: list[ForwardBackwardResult | Exception] = []
        for model_id, batch in calls:
            try:
                results.append(self.forward_backward(model_id, batch))
            except Exception as exc:  # noqa: BLE001 - the call's own failure, reported to its caller
                results.append(exc)
        return results

    def check_batch(self, base_model: str, batch: ForwardBackwardInput) -> None:
        """Refuse, with a UserError naming the datum, a batch that can never run on `base_model`: an unknown
        loss or config key, a sequence over the context or this server's cap, a token outside the
        vocabulary, loss inputs of the wrong shape. Called when the request arrives, before it is queued."""
        datums.check_batch(batch, self.datum_rules(base_model))

    def datum_rules(self, base_model: str) -> DatumRules:
        """What `base_model` accepts in a datum. This default: text only, up to the model's context; a
        backend that trains on images or caps sequences says so here."""
        return DatumRules(self.base_model_info(base_model))

    def check_optimizer(self, optimizer: OptimizerConfig) -> None:
        """UserError (at submission) for an optimizer this trainer does not have. This default: AdamW only."""
        adamw_only(optimizer, self.trainer_name())

    def trainer_name(self) -> str:
        return "this trainer"

    def runs_custom_losses(self) -> bool:
        """Whether `check_custom_loss` accepts graphs (client/config's custom_loss_server_side)."""
        return False

    def check_custom_loss(self, loss: CustomLoss) -> None:
        """Check an uploaded loss graph against the backend's allowlist; UserError names what is refused.

        A backend that runs custom losses (`batch.custom_loss` in forward_backward) overrides both."""
        raise UserError("this server's trainer does not run custom losses; they run client-side")

    @abstractmethod
    def optim_step(self, model_id: str, params: OptimParams) -> OptimStepResult:
        """Apply the run's optimizer with `params` (of its kind) to the accumulated gradients, then zero them."""

    @abstractmethod
    def save_state(self, model_id: str, directory: Path) -> None:
        """Write the adapter weights, the LoRA config and the optimizer state into `directory`."""

    @abstractmethod
    def load_state(self, model_id: str, directory: Path, *, with_optimizer: bool) -> None:
        """Load a `save_state` directory into the existing run `model_id`."""

    @abstractmethod
    def read_state_config(self, directory: Path) -> tuple[str, LoraConfig]:
        """(base_model, lora config) recorded in a `save_state` directory."""

    def read_state_optimizer(self, directory: Path) -> OptimizerConfig:
        """The optimizer whose state a `save_state` directory holds (every backend writes the one format)."""
        from tx.backends.torch import checkpoint

        return checkpoint.read_state_optimizer(directory)

    def read_adapter_config(self, adapter_file: Path) -> dict[str, Any]:
        """The checked config of a PEFT LoRA uploaded for import (`tx/backends/adapter_import.py`); UserError if
        it is not one tx can train on."""
        from tx.backends import adapter_import

        return adapter_import.read_config(adapter_file)

    def import_adapter(self, adapter_file: Path, base_model: str, out: Path) -> LoraConfig:
        """Write the uploaded PEFT LoRA as a training state of `base_model` into `out`, with a fresh optimizer
        state; runs on the training thread (it makes short-lived runs to learn where LoRA goes)."""
        from tx.backends import adapter_import

        return adapter_import.import_adapter(self, adapter_import.read_adapter(adapter_file), base_model, out)

    @abstractmethod
    def save_sampler_weights(self, model_id: str, directory: Path) -> None:
        """Write a standard PEFT adapter directory (adapter_config.json + safetensors)."""

    @abstractmethod
    def iter_trainable_weights(self, model_id: str) -> Iterator[tuple[str, Any]]:
        """(name, tensor) of the run's trainable weights, named as in its PEFT adapter files."""
