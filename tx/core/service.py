"""The use cases the routes call: sessions, training runs and their checkpoints.

Validation that needs no trainer happens here, at submission, so bad input fails fast with a
4xx. Work that needs the trainer becomes a job on the training thread and resolves a future.
"""

from __future__ import annotations

import functools
import logging
import shutil
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from tx.backends.base import TrainingBackend
from tx.core.checkpoints import CheckpointFiles, TinkerPath, validate_name, validate_ttl
from tx.core.custom_losses import CustomLosses
from tx.core.futures import Future, FutureRegistry
from tx.core.encryption import encrypt_tree, parse_recipients
from tx.core.results import CheckpointSaved, ExternalSaved, ModelCreated, SamplerSaved, WeightsLoaded
from tx.core.scheduler import Job, Scheduler
from tx.store.store import Store
from tx.store.tables import CheckpointRow, SamplingSessionRow, SessionRow, TrainingRunRow
from tx.types import (
    AdamParams,
    BaseModelInfo,
    ForwardBackwardInput,
    ForwardBackwardResult,
    LoraConfig,
    NotFoundError,
    UserError,
    model_id_for,
    sampler_id_for,
)

logger = logging.getLogger(__name__)


class SamplerEngines(Protocol):
    """What the service tells the engine manager: sampler saves (the trainer's own tensors, on the training
    thread) and sampling clients created from a saved path."""

    def save_sampler(self, base_model: str, run_id: str, directory: Path, label: str,
                     weights: Iterable[tuple[str, Any]], *, start: bool, sampler_id: str | None = None) -> None: ...

    def pin(self, sampler_id: str, directory: Path, label: str) -> None: ...


class TrainingService:
    def __init__(
        self,
        store: Store,
        backend: TrainingBackend,
        futures: FutureRegistry,
        scheduler: Scheduler,
        files: CheckpointFiles,
        training_lease: Callable[[], AbstractContextManager[Any]] | None = None,
        engines: SamplerEngines | None = None,
        versions_kept: int = 8,
    ) -> None:
        self.store = store
        self.backend = backend
        self.futures = futures
        self.scheduler = scheduler
        self.files = files
        self._training_lease = training_lease  # held around each training pass
        self._engines = engines
        self._versions_kept = versions_kept
        self.custom_losses = CustomLosses(futures, backend)
        self.trained_tokens = 0  # target tokens of every forward_backward (not forward-only) run

    # -- sessions ---------------------------------------------------------------------------
    def create_session(
        self, owner: str, sdk_version: str | None, tags: list[str], user_metadata: dict[str, Any],
        project_id: str | None = None, display_name: str | None = None,
    ) -> str:
        session_id = uuid.uuid4().hex
        self.store.create_session(
            SessionRow(
                session_id=session_id,
                owner=owner,
                sdk_version=sdk_version,
                tags=tags,
                user_metadata=user_metadata,
                project_id=project_id,
                display_name=display_name,
            )
        )
        return session_id

    def heartbeat(self, owner: str, session_id: str) -> None:
        self.store.heartbeat(session_id, owner)

    def _live_session(self, session_id: str, owner: str) -> SessionRow:
        row = self.store.get_session(session_id, owner)
        if row.finished_at is not None:
            raise UserError(f"session {session_id!r} is finished; start a new ServiceClient")
        return row

    def create_custom_loss(
        self, owner: str, session_id: str, seq_id: int, name: str,
        inputs: list[tuple[str, int]], nodes: list[dict[str, Any]],
    ) -> Future:
        self._live_session(session_id, owner)
        return self.custom_losses.create(owner, session_id, seq_id, name, inputs, nodes)

    # -- models -----------------------------------------------------------------------------
    def create_model(
        self,
        owner: str,
        session_id: str,
        model_seq_id: int,
        base_model: str,
        lora: LoraConfig,
        user_metadata: dict[str, Any] | None,
    ) -> Future:
        self._live_session(session_id, owner)
        lora.validate()
        self.base_model_info(base_model)
        model_id = model_id_for(session_id, model_seq_id)
        future, created = self.futures.create(
            owner, "CreateModel", ("model", model_id), session_id=session_id, track=model_id
        )
        if not created:
            return future

        def run() -> ModelCreated:
            self.backend.create_model(model_id, base_model, lora)
            self._record_run(model_id, session_id, owner, base_model, lora, user_metadata)
            return ModelCreated(model_id)

        self.scheduler.add_model(model_id)
        self.scheduler.submit_unsequenced(Job(future, run))
        return future

    def load_into_new_model(
        self, owner: str, session_id: str, model_seq_id: int, path: str, with_optimizer: bool
    ) -> Future:
        """create_training_client_from_state[_with_optimizer]: a new run from a checkpoint."""
        self._live_session(session_id, owner)
        source, source_run = self._readable_checkpoint(owner, path, kinds=("weights",))
        model_id = model_id_for(session_id, model_seq_id)
        future, created = self.futures.create(
            owner, "LoadWeights", ("model", model_id), session_id=session_id, track=model_id
        )
        if not created:
            return future

        def run() -> WeightsLoaded:
            directory = self.files.require(source)
            base_model, lora = self.backend.read_state_config(directory)
            self.backend.create_model(model_id, base_model, lora)
            self.backend.load_state(model_id, directory, with_optimizer=with_optimizer)
            self._record_run(model_id, session_id, owner, base_model, lora, source_run.user_metadata)
            return WeightsLoaded(path=str(source), model_id=model_id)

        self.scheduler.add_model(model_id)
        self.scheduler.submit_unsequenced(Job(future, run))
        return future

    def _record_run(
        self,
        model_id: str,
        session_id: str,
        owner: str,
        base_model: str,
        lora: LoraConfig,
        user_metadata: dict[str, Any] | None,
    ) -> None:
        self.store.create_run(
            TrainingRunRow(
                run_id=model_id,
                session_id=session_id,
                owner=owner,
                base_model=base_model,
                lora_rank=lora.rank,
                lora_config=asdict(lora),
                user_metadata=user_metadata,
            )
        )

    def served_models(self) -> list[BaseModelInfo]:
        return self.backend.served_models()

    def runs_custom_losses(self) -> bool:
        """Whether uploaded custom losses run here (client/config's custom_loss_server_side)."""
        return self.backend.runs_custom_losses()

    def base_model_info(self, base_model: str) -> BaseModelInfo:
        """The served base model's facts; a UserError naming the served ones if it is not served."""
        try:
            return self.backend.base_model_info(base_model)
        except NotFoundError:
            served = ", ".join(m.name for m in self.backend.served_models())
            raise UserError(f"base model {base_model!r} is not served here; served: {served}") from None

    # -- sequenced training operations ------------------------------------------------------
    def forward_backward(
        self, owner: str, model_id: str, seq_id: int, batch: ForwardBackwardInput
    ) -> Future:
        run = self.store.get_run(model_id, owner)
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
        return self._sequenced(owner, model_id, seq_id, kind, train, lease, check)

    def optim_step(self, owner: str, model_id: str, seq_id: int, adam: AdamParams) -> Future:
        adam.validate()
        return self._sequenced(
            owner, model_id, seq_id, "OptimStep", lambda: self.backend.optim_step(model_id, adam),
            self._training_lease,
        )

    def save_weights(
        self, owner: str, model_id: str, seq_id: int, name: str, ttl_s: int | None, overwrite: bool,
        user_metadata: dict[str, Any] | None,
    ) -> Future:
        path = self._new_checkpoint_path(model_id, "weights", name, ttl_s)

        def run() -> CheckpointSaved:
            self._write_checkpoint(
                owner, path, lambda d: self.backend.save_state(model_id, d), ttl_s, overwrite, user_metadata
            )
            return CheckpointSaved(str(path))

        return self._sequenced(owner, model_id, seq_id, "SaveWeights", run)

    def save_weights_for_sampler(
        self, owner: str, model_id: str, seq_id: int, name: str | None,
        sampling_session_seq_id: int | None, ttl_s: int | None,
        user_metadata: dict[str, Any] | None,
    ) -> Future:
        if name is None and sampling_session_seq_id is None:
            raise UserError("save_weights_for_sampler needs a path or a sampling_session_seq_id")
        if name is not None:
            path = self._new_checkpoint_path(model_id, "sampler_weights", name, ttl_s)

            def run() -> SamplerSaved:
                self._write_checkpoint(
                    owner, path, lambda d: self.backend.save_sampler_weights(model_id, d), ttl_s, True,
                    user_metadata,
                )
                self._published(owner, model_id, self.files.directory(path), str(path), start=False)
                return SamplerSaved(path=str(path), sampling_session_id=None)

        else:
            run = lambda: self._save_ephemeral_sampler(owner, model_id, sampling_session_seq_id)  # noqa: E731

        return self._sequenced(owner, model_id, seq_id, "SaveWeightsForSampler", run)

    def save_weights_external(
        self, owner: str, model_id: str, seq_id: int, name: str, ttl_s: int | None,
        age_recipients: list[str] | None,
    ) -> Future:
        """The run's adapter as a PEFT directory (vLLM and PEFT load it), age-encrypted if asked."""
        path = self._new_checkpoint_path(model_id, "external_weights", name, ttl_s)
        recipients = parse_recipients(age_recipients) if age_recipients is not None else None

        def write(directory: Path) -> None:
            self.backend.save_sampler_weights(model_id, directory)
            if recipients is not None:
                encrypt_tree(directory, recipients)

        def run() -> ExternalSaved:
            size = self._write_checkpoint(owner, path, write, ttl_s, True, None)
            return ExternalSaved(path=str(path), size_bytes=size)

        return self._sequenced(owner, model_id, seq_id, "SaveWeightsExternal", run)

    def _save_ephemeral_sampler(self, owner: str, model_id: str, seq: int | None) -> SamplerSaved:
        run = self.store.get_run(model_id, owner)
        sampler_id = sampler_id_for(run.session_id, int(seq or 0))
        directory = self.files.ephemeral_dir(model_id, int(seq or 0))
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        self.backend.save_sampler_weights(model_id, directory)
        self._evict_old_versions(directory.parent)
        self.store.create_sampling_session(
            SamplingSessionRow(
                sampling_session_id=sampler_id,
                session_id=run.session_id,
                owner=owner,
                base_model=run.base_model,
                model_path=None,
                run_id=model_id,
                weights_dir=str(directory),
            )
        )
        self._published(owner, model_id, directory, f"the sampler weights of sampling session {sampler_id}",
                        start=True, sampler_id=sampler_id)
        return SamplerSaved(path=None, sampling_session_id=sampler_id)

    def _evict_old_versions(self, parent: Path) -> None:
        versions = sorted(parent.iterdir(), key=lambda p: p.stat().st_mtime_ns)
        for old in versions[: max(0, len(versions) - self._versions_kept)]:
            shutil.rmtree(old, ignore_errors=True)

    def _published(self, owner: str, model_id: str, directory: Path, label: str, *, start: bool,
                   sampler_id: str | None = None) -> None:
        """Hand the engines the trainer's tensors as a new weight version (starting them only for a run about
        to sample). The directory was written too: for checkpoints, and for engines that load files."""
        if self._engines is not None:
            base_model = self.store.get_run(model_id, owner).base_model
            self._engines.save_sampler(base_model, model_id, directory, label,
                                       self.backend.iter_trainable_weights(model_id), start=start,
                                       sampler_id=sampler_id)

    def load_state(self, owner: str, model_id: str, seq_id: int, path: str, with_optimizer: bool) -> Future:
        """Legacy TrainingClient.load_state*: load a checkpoint into this existing run."""
        source, _ = self._readable_checkpoint(owner, path, kinds=("weights",))

        def run() -> WeightsLoaded:
            self.backend.load_state(model_id, self.files.require(source), with_optimizer=with_optimizer)
            return WeightsLoaded(path=str(source), model_id=model_id)

        return self._sequenced(owner, model_id, seq_id, "LoadWeights", run)

    def reject_seq(self, owner: str, model_id: str, seq_id: int) -> None:
        """A sequenced request of `owner` was refused at submission: its seq_id counts as done."""
        try:
            self.store.get_run(model_id, owner)
        except NotFoundError:
            return  # not the caller's run: it may not move another tenant's queue
        self.scheduler.reject(model_id, seq_id)

    def _sequenced(
        self, owner: str, model_id: str, seq_id: int, kind: str, fn: Callable[[], Any],
        lease: Callable[[], AbstractContextManager[Any]] | None = None,
        check: Callable[[], None] | None = None,
    ) -> Future:
        """Queue `fn` as `model_id`'s call `seq_id`. `check` raises (a UserError) for work that can never run:
        it is refused here, before a future exists, and the route counts its seq_id as used."""
        run = self.store.get_run(model_id, owner)
        if seq_id < 1:
            raise UserError(f"seq_id must be >= 1, got {seq_id}")
        if not self.scheduler.has_model(model_id):
            raise UserError(
                f"model {model_id!r} is not loaded on this server (it may have been restarted); "
                "create a training client from one of its checkpoints"
            )
        if check is not None:
            check()
        future, created = self.futures.create(
            owner, kind, ("seq", model_id, seq_id), session_id=run.session_id, track=model_id
        )
        if not created:
            return future
        self.store.touch_run(model_id)
        self.scheduler.submit(model_id, seq_id, Job(future, fn, lease))
        return future

    # -- checkpoints ------------------------------------------------------------------------
    def _new_checkpoint_path(self, model_id: str, kind: str, name: str, ttl_s: int | None) -> TinkerPath:
        validate_name(name)
        validate_ttl(ttl_s)
        return TinkerPath(model_id, kind, name)

    def _write_checkpoint(
        self, owner: str, path: TinkerPath, writer: Callable[[Any], None], ttl_s: int | None,
        overwrite: bool, user_metadata: dict[str, Any] | None,
    ) -> int:
        size = self.files.write(path, writer, overwrite=overwrite)
        now = datetime.now(timezone.utc)
        self.store.add_checkpoint(
            CheckpointRow(
                run_id=path.run_id,
                checkpoint_id=path.checkpoint_id,
                kind=path.kind,
                owner=owner,
                size_bytes=size,
                created_at=now,
                expires_at=now + timedelta(seconds=ttl_s) if ttl_s else None,
                user_metadata=user_metadata,
            ),
            overwrite=True,
        )
        return size

    def sampling_target(self, owner: str, model: str) -> tuple[str, Path | None]:
        """(base model, weights dir or None) for a model named by a served base model or a tinker path
        the caller may sample (its own, or published)."""
        if model.startswith("tinker://"):
            path, run = self._readable_checkpoint(owner, model, kinds=("sampler_weights", "weights"))
            return run.base_model, self.files.require(path)
        self.base_model_info(model)
        return model, None

    def _readable_checkpoint(
        self, owner: str, path: str, kinds: tuple[str, ...]
    ) -> tuple[TinkerPath, TrainingRunRow]:
        """A checkpoint the caller may load or sample (its own, or a published one), and its run."""
        parsed = TinkerPath.parse(path)
        if parsed.kind not in kinds:
            raise UserError(f"{path} is a {parsed.kind} checkpoint; this call needs one of {kinds}")
        row = self.store.get_checkpoint(parsed.run_id, parsed.checkpoint_id, owner, public_ok=True)
        return parsed, self.store.get_run(parsed.run_id, row.owner)

    # -- session end ------------------------------------------------------------------------
    def finish_session(self, owner: str, session_id: str, reason: str) -> None:
        self.store.finish_session(session_id, owner, reason)
        self.custom_losses.forget_session(session_id)
        for model_id in self.store.runs_of_session(session_id):
            if self.scheduler.has_model(model_id):
                self._unload(owner, model_id)

    def reap_stale_sessions(self, timeout_s: float) -> int:
        """Finish sessions that stopped heartbeating (a crashed client), freeing their models."""
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=timeout_s)
        stale = self.store.stale_sessions(cutoff)
        for row in stale:
            logger.warning("session %s sent no heartbeat for %.0f s; finishing it", row.session_id, timeout_s)
            self.finish_session(row.owner, row.session_id, "timeout")
        return len(stale)

    def _unload(self, owner: str, model_id: str) -> None:
        future, _ = self.futures.create(owner, "Unload")
        self.scheduler.remove_model(model_id)
        self.scheduler.submit_unsequenced(Job(future, lambda: self.backend.delete_model(model_id)))

    # -- sampling sessions ------------------------------------------------------------------
    def create_sampling_session(
        self, owner: str, session_id: str, seq: int, base_model: str | None, model_path: str | None
    ) -> str:
        """A sampler on a base model, or on sampler (or training) weights named by a tinker path."""
        self._live_session(session_id, owner)
        run_id = weights_dir = None
        if model_path is not None:
            path, run = self._readable_checkpoint(owner, model_path, kinds=("sampler_weights", "weights"))
            if base_model is not None and base_model != run.base_model:
                raise UserError(f"{model_path} was trained on {run.base_model!r}, not {base_model!r}")
            base_model, run_id = run.base_model, run.run_id
            weights_dir = str(self.files.require(path))
        assert base_model is not None  # the wire schema requires base_model or model_path
        self.base_model_info(base_model)
        sampler_id = sampler_id_for(session_id, seq)
        if weights_dir is not None and model_path is not None and self._engines is not None:
            self._engines.pin(sampler_id, Path(weights_dir), model_path)  # the newest version of that path
        self.store.create_sampling_session(
            SamplingSessionRow(
                sampling_session_id=sampler_id, session_id=session_id, owner=owner,
                base_model=base_model, model_path=model_path, run_id=run_id, weights_dir=weights_dir,
            )
        )
        return sampler_id
