"""Training runs: created (empty, or from a checkpoint), recorded in the store, and unloaded when their
session ends. A run is a model on the training thread; its calls are `training.py`'s and `checkpoints/`'s."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from tx.backends.base import TrainingBackend
from tx.core.base_models import BaseModels
from tx.core.checkpoints.catalog import CheckpointCatalog
from tx.core.futures import Future, FutureRegistry
from tx.core.results import ModelCreated, WeightsLoaded
from tx.core.scheduler import Job, Scheduler
from tx.core.sessions import live_session
from tx.store.store import Store
from tx.store.tables import TrainingRunRow
from tx.types import LoraConfig, model_id_for


class RunService:
    def __init__(self, store: Store, backend: TrainingBackend, futures: FutureRegistry, scheduler: Scheduler,
                 catalog: CheckpointCatalog, base_models: BaseModels) -> None:
        self.store = store
        self.backend = backend
        self.futures = futures
        self.scheduler = scheduler
        self.catalog = catalog
        self.base_models = base_models

    def create(self, owner: str, session_id: str, model_seq_id: int, base_model: str, lora: LoraConfig,
               user_metadata: dict[str, Any] | None) -> Future:
        live_session(self.store, session_id, owner)
        lora.validate()
        self.base_models.info(base_model)
        model_id = model_id_for(session_id, model_seq_id)

        def run() -> ModelCreated:
            self.backend.create_model(model_id, base_model, lora)
            self._record(model_id, session_id, owner, base_model, lora, user_metadata)
            return ModelCreated(model_id)

        return self._start(owner, session_id, model_id, "CreateModel", run)

    def create_from_checkpoint(self, owner: str, session_id: str, model_seq_id: int, path: str,
                               with_optimizer: bool) -> Future:
        """create_training_client_from_state[_with_optimizer]: a new run from a checkpoint."""
        live_session(self.store, session_id, owner)
        source, source_run = self.catalog.readable(owner, path, kinds=("weights",))
        model_id = model_id_for(session_id, model_seq_id)

        def run() -> WeightsLoaded:
            directory = self.catalog.files.require(source)
            base_model, lora = self.backend.read_state_config(directory)
            self.backend.create_model(model_id, base_model, lora)
            self.backend.load_state(model_id, directory, with_optimizer=with_optimizer)
            self._record(model_id, session_id, owner, base_model, lora, source_run.user_metadata)
            return WeightsLoaded(path=str(source), model_id=model_id)

        return self._start(owner, session_id, model_id, "LoadWeights", run)

    def _start(self, owner: str, session_id: str, model_id: str, kind: str, run: Callable[[], Any]) -> Future:
        """The future of the call that makes run `model_id` (a resend gets the same one), its job queued."""
        future, created = self.futures.create(owner, kind, ("model", model_id), session_id=session_id,
                                              track=model_id)
        if created:
            self.scheduler.add_model(model_id)
            self.scheduler.submit_unsequenced(Job(future, run))
        return future

    def forget_session(self, owner: str, session_id: str) -> None:
        """The session ended: its runs' models leave the trainer (their rows and checkpoints stay)."""
        for model_id in self.store.runs_of_session(session_id):
            if self.scheduler.has_model(model_id):
                future, _ = self.futures.create(owner, "Unload")
                self.scheduler.remove_model(model_id)
                self.scheduler.submit_unsequenced(Job(future, self._unloader(model_id)))

    def _unloader(self, model_id: str):
        return lambda: self.backend.delete_model(model_id)

    def _record(self, model_id: str, session_id: str, owner: str, base_model: str, lora: LoraConfig,
                user_metadata: dict[str, Any] | None) -> None:
        self.store.create_run(TrainingRunRow(
            run_id=model_id, session_id=session_id, owner=owner, base_model=base_model, lora_rank=lora.rank,
            lora_config=asdict(lora), user_metadata=user_metadata,
        ))
