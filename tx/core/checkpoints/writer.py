"""A run's saves: training state (`weights/`), sampler weights (`sampler_weights/`, or an ephemeral sampler
version for `save_weights_and_get_sampling_client`) and exported adapters (`external_weights/`).

Each save is a sequenced call of its run (`tx/core/sequencing.py`): the files are written atomically
(`files.py`), then the row is recorded. Sampler weights also go to the engine manager as a new weight version
(the trainer's own tensors; the directory is written too, for checkpoints and for engines that load files).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from tx.backends.base import TrainingBackend
from tx.core import quotas
from tx.core.audit import AuditTrail
from tx.core.checkpoints.encryption import encrypt_tree, parse_recipients
from tx.core.checkpoints.files import CheckpointFiles, TinkerPath, validate_name, validate_ttl
from tx.core.futures import Future
from tx.core.results import CheckpointSaved, ExternalSaved, SamplerSaved
from tx.core.sequencing import Sequencer
from tx.store.tables import CheckpointRow, SamplingSessionRow
from tx.types import UserError, sampler_id_for


class SamplerEngines(Protocol):
    """What the saves tell the engine manager: sampler saves (the trainer's own tensors, on the training
    thread) and sampling clients created from a saved path."""

    def save_sampler(self, base_model: str, run_id: str, directory: Path, label: str,
                     weights: Iterable[tuple[str, Any]], *, start: bool, sampler_id: str | None = None,
                     inflight: bool = False) -> None: ...

    def prestart(self, base_model: str) -> None: ...

    def pin(self, sampler_id: str, directory: Path, label: str) -> None: ...

    def revoke(self, directory: Path, reason: str) -> None: ...


class CheckpointWriter:
    def __init__(self, sequencer: Sequencer, backend: TrainingBackend, files: CheckpointFiles,
                 engines: SamplerEngines | None = None, versions_kept: int = 8,
                 audit: AuditTrail | None = None) -> None:
        self.audit = audit
        self.sequencer = sequencer
        self.store = sequencer.store
        self.backend = backend
        self.files = files
        self._engines = engines
        self._versions_kept = versions_kept

    def save_weights(self, owner: str, model_id: str, seq_id: int, name: str, ttl_s: int | None,
                     overwrite: bool, user_metadata: dict[str, Any] | None) -> Future:
        path = _new_path(model_id, "weights", name, ttl_s)

        def run() -> CheckpointSaved:
            self._write(owner, path, lambda d: self.backend.save_state(model_id, d), ttl_s, overwrite, user_metadata)
            return CheckpointSaved(str(path))

        return self.sequencer.submit(owner, model_id, seq_id, "SaveWeights", run, check=self._room(owner))

    def save_weights_for_sampler(self, owner: str, model_id: str, seq_id: int, name: str | None,
                                 sampling_session_seq_id: int | None, ttl_s: int | None,
                                 user_metadata: dict[str, Any] | None, inflight: bool = False) -> Future:
        """`inflight`: the new sampling client follows the run's inflight weights (`SamplingClientKind`): this save
        and every later inflight save of the run, pushed into engines in place (docs/engines.md#weight-versions)."""
        if name is None and sampling_session_seq_id is None:
            raise UserError("save_weights_for_sampler needs a path or a sampling_session_seq_id")
        if name is not None and inflight:
            raise UserError("kind 'inflight' makes a sampling client (save_weights_and_get_sampling_client); "
                            "a save to a path is a snapshot")
        if name is None:
            run = lambda: self._save_ephemeral_sampler(owner, model_id, sampling_session_seq_id, inflight)  # noqa: E731
            future = self.sequencer.submit(owner, model_id, seq_id, "SaveWeightsForSampler", run)
            if self._engines is not None:  # the run is about to sample: its engines start while the save waits
                self._engines.prestart(self.store.get_run(model_id, owner).base_model)  # and is written
            return future
        path = _new_path(model_id, "sampler_weights", name, ttl_s)

        def save() -> SamplerSaved:
            self._write(owner, path, lambda d: self.backend.save_sampler_weights(model_id, d), ttl_s, True,
                        user_metadata)
            self._published(owner, model_id, self.files.directory(path), str(path), start=False)
            return SamplerSaved(path=str(path), sampling_session_id=None)

        return self.sequencer.submit(owner, model_id, seq_id, "SaveWeightsForSampler", save, check=self._room(owner))

    def save_weights_external(self, owner: str, model_id: str, seq_id: int, name: str, ttl_s: int | None,
                              age_recipients: list[str] | None) -> Future:
        """The run's adapter as a PEFT directory (vLLM and PEFT load it), age-encrypted if asked."""
        path = _new_path(model_id, "external_weights", name, ttl_s)
        recipients = parse_recipients(age_recipients) if age_recipients is not None else None

        def write(directory: Path) -> None:
            self.backend.save_sampler_weights(model_id, directory)
            if recipients is not None:
                encrypt_tree(directory, recipients)

        def run() -> ExternalSaved:
            return ExternalSaved(path=str(path), size_bytes=self._write(owner, path, write, ttl_s, True, None))

        return self.sequencer.submit(owner, model_id, seq_id, "SaveWeightsExternal", run, check=self._room(owner))

    def _room(self, owner: str) -> Callable[[], None]:
        """The check at submission of a named save: the key's checkpoints are under its `checkpoint_bytes` quota
        (a save that crosses it is kept; the next one is refused)."""
        limit = self.sequencer.limits.checkpoint_bytes
        return lambda: quotas.check("checkpoint_bytes", self.store.checkpoint_bytes(owner), 1, limit,
                                    asked="a new save")

    def _save_ephemeral_sampler(self, owner: str, model_id: str, seq: int | None, inflight: bool) -> SamplerSaved:
        run = self.store.get_run(model_id, owner)
        sampler_id = sampler_id_for(run.session_id, int(seq or 0))
        directory = self.files.ephemeral_dir(model_id, int(seq or 0))
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        self.backend.save_sampler_weights(model_id, directory)
        self._evict_old_versions(directory.parent)
        self.store.create_sampling_session(SamplingSessionRow(
            sampling_session_id=sampler_id, session_id=run.session_id, owner=owner, base_model=run.base_model,
            model_path=None, run_id=model_id, weights_dir=str(directory),
        ))
        self._published(owner, model_id, directory, f"the sampler weights of sampling session {sampler_id}",
                        start=True, sampler_id=sampler_id, inflight=inflight)
        return SamplerSaved(path=None, sampling_session_id=sampler_id)

    def _evict_old_versions(self, parent: Path) -> None:
        versions = sorted(parent.iterdir(), key=lambda p: p.stat().st_mtime_ns)
        for old in versions[: max(0, len(versions) - self._versions_kept)]:
            shutil.rmtree(old, ignore_errors=True)

    def _published(self, owner: str, model_id: str, directory: Path, label: str, *, start: bool,
                   sampler_id: str | None = None, inflight: bool = False) -> None:
        """Hand the engines the trainer's tensors as a new weight version (starting them only for a run about
        to sample)."""
        if self._engines is not None:
            base_model = self.store.get_run(model_id, owner).base_model
            self._engines.save_sampler(base_model, model_id, directory, label,
                                       self.backend.iter_trainable_weights(model_id), start=start,
                                       sampler_id=sampler_id, inflight=inflight)

    def _write(self, owner: str, path: TinkerPath, writer: Callable[[Any], None], ttl_s: int | None,
               overwrite: bool, user_metadata: dict[str, Any] | None) -> int:
        size = self.files.write(path, writer, overwrite=overwrite)
        now = datetime.now(timezone.utc)
        self.store.add_checkpoint(CheckpointRow(
            run_id=path.run_id, checkpoint_id=path.checkpoint_id, kind=path.kind, owner=owner, size_bytes=size,
            created_at=now, expires_at=now + timedelta(seconds=ttl_s) if ttl_s else None,
            user_metadata=user_metadata,
        ), overwrite=True)
        if self.audit is not None:
            self.audit.record("checkpoint_save", owner, run_id=path.run_id, tinker_path=str(path), kind=path.kind)
        return size


def _new_path(model_id: str, kind: str, name: str, ttl_s: int | None) -> TinkerPath:
    validate_name(name)
    validate_ttl(ttl_s)
    return TinkerPath(model_id, kind, name)
