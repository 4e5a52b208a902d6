"""Training runs: created (empty, or from a checkpoint), recorded in the store, and unloaded when their
session ends. A run is a model on the training thread; its calls are `training.py`'s and `checkpoints/`'s.

A key's loaded runs count against its `runs` and `lora_rank` quotas (`quotas.py`) from the moment a run is
asked for until it is unloaded (or its creation failed)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from tx.backends.base import TrainingBackend
from tx.core import quotas
from tx.core.base_models import BaseModels
from tx.core.checkpoints.catalog import CheckpointCatalog
from tx.core.futures import Future, FutureRegistry
from tx.core.quotas import QuotaLimits
from tx.core.results import ModelCreated, WeightsLoaded
from tx.core.run_labels import NO_LABELS, RunLabels, labels_of_metadata, run_labels
from tx.core.scheduler import Job, Scheduler
from tx.core.sessions import live_session
from tx.optimizers import ADAMW, OptimizerConfig
from tx.store.store import Store
from tx.store.tables import TrainingRunRow
from tx.types import ConflictError, LoraConfig, UserError, model_id_for

T = TypeVar("T")


@dataclass
class Hold:
    """A run counted against its key's quotas, from the call that makes it until it is unloaded or that call
    fails having loaded nothing (`future`: that call's, None once the run is loaded)."""

    owner: str
    rank: int
    future: Future | None = None

    def abandoned(self) -> bool:
        """The call was cancelled (or failed) before it started: nothing was ever loaded for it."""
        return self.future is not None and self.future.done and self.future.started_at is None


class RunService:
    def __init__(self, store: Store, backend: TrainingBackend, futures: FutureRegistry, scheduler: Scheduler,
                 catalog: CheckpointCatalog, base_models: BaseModels, limits: QuotaLimits | None = None) -> None:
        self.store = store
        self.backend = backend
        self.futures = futures
        self.scheduler = scheduler
        self.catalog = catalog
        self.base_models = base_models
        self.limits = limits or QuotaLimits()
        self._held: dict[str, Hold] = {}  # model_id -> its hold, loaded or being loaded
        self._lock = threading.Lock()

    def create(self, owner: str, session_id: str, model_seq_id: int, base_model: str, lora: LoraConfig,
               user_metadata: dict[str, Any] | None, optimizer: OptimizerConfig = ADAMW) -> Future:
        live_session(self.store, session_id, owner)
        lora.validate()
        self.backend.check_optimizer(optimizer)
        self.base_models.info(base_model)
        labels = labels_of_metadata(user_metadata)
        model_id = model_id_for(session_id, model_seq_id)

        def run() -> ModelCreated:
            self.backend.create_model(model_id, base_model, lora, optimizer)
            with self._unloaded_if_failing(model_id):
                self._record(model_id, session_id, owner, base_model, lora, user_metadata, optimizer,
                             labels=labels)
            return ModelCreated(model_id)

        return self._start(owner, session_id, model_id, "CreateModel", run, lambda: lora.rank,
                           lambda: ModelCreated(model_id))

    def create_from_checkpoint(self, owner: str, session_id: str, model_seq_id: int, path: str,
                               with_optimizer: bool, optimizer: OptimizerConfig | None = None) -> Future:
        """create_training_client_from_state[_with_optimizer]: a new run from a checkpoint, trained with the
        checkpoint's optimizer when its state is loaded too, else with `optimizer` (AdamW when None)."""
        live_session(self.store, session_id, owner)
        if optimizer is not None:
            self.backend.check_optimizer(optimizer)
        source, source_run = self.catalog.readable(owner, path, kinds=("weights",), purpose="load")
        self.base_models.check_same_weights(source_run, str(source))
        model_id = model_id_for(session_id, model_seq_id)

        def run() -> WeightsLoaded:
            directory = self.catalog.files.require(source)
            base_model, lora = self.backend.read_state_config(directory)
            saved = self.backend.read_state_optimizer(directory)
            if with_optimizer and optimizer is not None and optimizer != saved:
                raise UserError(f"{source} holds {saved.kind} state: a run resumed with it trains with {saved.kind}")
            kind = saved if with_optimizer else optimizer or ADAMW
            self.backend.create_model(model_id, base_model, lora, kind)
            with self._unloaded_if_failing(model_id):
                self.backend.load_state(model_id, directory, with_optimizer=with_optimizer)
                self._record(model_id, session_id, owner, base_model, lora, source_run.user_metadata, kind,
                             str(source), RunLabels(source_run.name, tuple(source_run.tags or ())))
            return WeightsLoaded(path=str(source), model_id=model_id)

        def rank() -> int:  # read at submission, for the key's quota
            return self.backend.read_state_config(self.catalog.files.require(source))[1].rank

        return self._start(owner, session_id, model_id, "LoadWeights", run, rank,
                           lambda: WeightsLoaded(path=str(source), model_id=model_id))

    def _start(self, owner: str, session_id: str, model_id: str, kind: str, run: Callable[[], Any],
               rank: Callable[[], int], repeated: Callable[[], Any]) -> Future:
        """The future of the call that makes run `model_id`, its job queued once the run fits the key's quotas
        (QuotaExceededError otherwise, before anything is queued). A resend gets the first call's future while it
        is held, and once it was forgotten, a future answered with `repeated()` if the run is the caller's and
        loaded: a repeat never loads a second adapter nor touches the hold. A run id that exists otherwise (a copy
        made into that slot, another key's) is a ConflictError."""
        resent = self.futures.find(("model", model_id))
        if resent is not None:
            return resent
        with self._lock:
            self._drop_abandoned()
            held = self._held.get(model_id)
        if held is not None and held.owner == owner and held.future is None:
            future, _ = self.futures.create(owner, kind, session_id=session_id, track=model_id)
            self.futures.resolve(future, repeated())
            return future
        if held is not None or model_id in self.store.runs_of_session(session_id):
            raise ConflictError(f"training run {model_id!r} already exists; create the run under an unused "
                                "model_seq_id")
        hold = self._hold(owner, model_id, rank())
        future, created = self.futures.create(owner, kind, ("model", model_id), session_id=session_id,
                                              track=model_id)
        hold.future = future
        if created:
            self.scheduler.add_model(model_id, tenant=owner)
            self.scheduler.submit_unsequenced(Job(future, self._holding(model_id, hold, run)))
        return future

    def usage(self) -> dict[str, tuple[int, int]]:
        """{owner: (runs held, their LoRA ranks summed)}."""
        with self._lock:
            self._drop_abandoned()
            held: dict[str, tuple[int, int]] = {}
            for hold in self._held.values():
                runs, ranks = held.get(hold.owner, (0, 0))
                held[hold.owner] = (runs + 1, ranks + hold.rank)
            return held

    def _hold(self, owner: str, model_id: str, rank: int) -> Hold:
        """Count the run against its key's quotas; QuotaExceededError past them (before anything is queued)."""
        with self._lock:
            self._drop_abandoned()
            mine = [hold.rank for hold in self._held.values() if hold.owner == owner]
            quotas.check("runs", len(mine), 1, self.limits.runs)
            quotas.check("lora_rank", sum(mine), rank, self.limits.lora_rank)
            hold = self._held[model_id] = Hold(owner, rank)
            return hold

    def _drop_abandoned(self) -> None:
        """Holds whose call was cancelled while queued: its job never ran, so nothing released them (lock held)."""
        for model_id in [m for m, hold in self._held.items() if hold.abandoned()]:
            del self._held[model_id]

    def _release(self, model_id: str, hold: Hold | None = None) -> None:
        """Drop the run's hold (only `hold` itself, when given: never another call's)."""
        with self._lock:
            if hold is None or self._held.get(model_id) is hold:
                self._held.pop(model_id, None)

    def _holding(self, model_id: str, hold: Hold, run: Callable[[], T]) -> Callable[[], T]:
        """`run` under its hold: kept once the run is loaded, released if `run` fails (having loaded nothing:
        the run functions unload what they loaded before raising)."""

        def guarded() -> T:
            try:
                result = run()
            except BaseException:
                self._release(model_id, hold)
                raise
            hold.future = None
            return result

        return guarded

    @contextmanager
    def _unloaded_if_failing(self, model_id: str) -> Iterator[None]:
        """Undo `create_model` when what follows it fails, so a failed call leaves nothing loaded."""
        try:
            yield
        except BaseException:
            self.backend.delete_model(model_id)
            raise

    def set_labels(self, owner: str, run_id: str, name: str | None, tags: list[str] | None) -> RunLabels:
        """Name and tag the owner's run (None: that one unchanged); its labels now."""
        run = self.store.get_run(run_id, owner)
        labels = run_labels(run.name if name is None else name, (run.tags or []) if tags is None else tags)
        self.store.set_run_labels(run_id, owner, labels.name, list(labels.tags) or None)
        return labels

    def forget_session(self, owner: str, session_id: str) -> None:
        """The session ended: its runs' models leave the trainer (their rows and checkpoints stay)."""
        for model_id in self.store.runs_of_session(session_id):
            self._release(model_id)
            if self.scheduler.has_model(model_id):
                future, _ = self.futures.create(owner, "Unload")
                self.scheduler.remove_model(model_id)
                self.scheduler.submit_unsequenced(Job(future, self._unloader(model_id)))

    def _unloader(self, model_id: str):
        return lambda: self.backend.delete_model(model_id)

    def _record(self, model_id: str, session_id: str, owner: str, base_model: str, lora: LoraConfig,
                user_metadata: dict[str, Any] | None, optimizer: OptimizerConfig, source: str | None = None,
                labels: RunLabels = NO_LABELS) -> None:
        weights = self.base_models.provenance(base_model)
        self.store.create_run(TrainingRunRow(
            run_id=model_id, session_id=session_id, owner=owner, base_model=base_model, lora_rank=lora.rank,
            lora_config=asdict(lora), user_metadata=user_metadata,
            optimizer_config={"type": optimizer.kind, "version": optimizer.version},
            base_revision=weights.revision if weights else None,
            base_fingerprint=weights.fingerprint if weights else None,
            name=labels.name, tags=list(labels.tags) or None,
        ))
        self.catalog.audit.record("run_create", owner, run_id=model_id, base_model=base_model, lora_rank=lora.rank,
                                  optimizer=optimizer.kind, **({"from_checkpoint": source} if source else {}))
