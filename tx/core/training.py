"""A run's sequenced training calls: forward_backward (and forward), optim_step, and load_state into the run.
Each is checked at submission (`sequencing.py`) and runs on the training thread in seq_id order."""

from __future__ import annotations

import functools

from tx.backends.base import TrainingBackend
from tx.core.checkpoints.catalog import CheckpointCatalog
from tx.core.custom_losses import CustomLosses
from tx.core.futures import Future
from tx.core.results import WeightsLoaded
from tx.core.sequencing import Lease, Sequencer
from tx.types import AdamParams, ForwardBackwardInput, ForwardBackwardResult


class TrainingCalls:
    def __init__(self, sequencer: Sequencer, backend: TrainingBackend, custom_losses: CustomLosses,
                 catalog: CheckpointCatalog, training_lease: Lease | None = None) -> None:
        self.sequencer = sequencer
        self.backend = backend
        self.custom_losses = custom_losses
        self.catalog = catalog
        self._training_lease = training_lease  # held around each training pass
        self.trained_tokens = 0  # target tokens of every forward_backward (not forward-only) run

    def forward_backward(self, owner: str, model_id: str, seq_id: int, batch: ForwardBackwardInput) -> Future:
        run = self.sequencer.store.get_run(model_id, owner)
        if batch.loss_fn == "custom":
            batch = self.custom_losses.attach(run.session_id, batch)
        kind = "Forward" if batch.forward_only else "ForwardBackward"
        lease = None if batch.forward_only else self._training_lease

        def train() -> ForwardBackwardResult:
            result = self.backend.forward_backward(model_id, batch)
            if not batch.forward_only:  # only the training thread writes it
                self.trained_tokens += sum(len(output["logprobs"]) for output in result.loss_fn_outputs)
            return result

        check = functools.partial(self.backend.check_batch, run.base_model, batch)
        return self.sequencer.submit(owner, model_id, seq_id, kind, train, lease, check)

    def optim_step(self, owner: str, model_id: str, seq_id: int, adam: AdamParams) -> Future:
        adam.validate()
        return self.sequencer.submit(
            owner, model_id, seq_id, "OptimStep", lambda: self.backend.optim_step(model_id, adam),
            self._training_lease,
        )

    def load_state(self, owner: str, model_id: str, seq_id: int, path: str, with_optimizer: bool) -> Future:
        """Legacy TrainingClient.load_state*: load a checkpoint into this existing run."""
        source, _ = self.catalog.readable(owner, path, kinds=("weights",))

        def run() -> WeightsLoaded:
            self.backend.load_state(model_id, self.catalog.files.require(source), with_optimizer=with_optimizer)
            return WeightsLoaded(path=str(source), model_id=model_id)

        return self.sequencer.submit(owner, model_id, seq_id, "LoadWeights", run)
