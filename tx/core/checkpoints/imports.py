"""Adapters trained elsewhere, brought in: a PEFT LoRA becomes a training-state checkpoint of the caller's.

Rules:
- The caller uploads the adapter (`tx checkpoints import`, `POST /api/v1/tx/checkpoints/import`) for one of
  the served base models. It becomes `tinker://<run>/weights/<name>` in a new training run of the caller's that
  holds only it and is never trained (a new session, finished at once, as a copy's is), so the SDK loads it
  with `create_training_client_from_state` and samples what it trains.
- At submission: the name, the base model, the adapter's config (a plain LoRA), its rank against the key's
  `lora_rank` quota (the rank a run made from it would hold) and the key's `checkpoint_bytes`.
- On the training thread: the trainer checks every tensor against where it places LoRA on that base model and
  writes the state (`TrainingBackend.import_adapter`); its optimizer state starts fresh. The files are written
  atomically and recorded after, so a refused adapter leaves nothing behind.
- The upload is deleted once the import has finished, whichever way.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import asdict
from pathlib import Path

from tx.backends.base import TrainingBackend
from tx.core import quotas
from tx.core.audit import AuditTrail
from tx.core.base_models import BaseModels
from tx.core.checkpoints.files import CheckpointFiles, TinkerPath, tree_size, validate_name
from tx.core.futures import Future, FutureRegistry
from tx.core.results import CheckpointSaved
from tx.core.scheduler import Job, Scheduler
from tx.store.store import Store
from tx.store.tables import CheckpointRow, SessionRow, TrainingRunRow, utcnow
from tx.types import model_id_for

logger = logging.getLogger(__name__)


class AdapterImports:
    def __init__(self, store: Store, backend: TrainingBackend, futures: FutureRegistry, scheduler: Scheduler,
                 files: CheckpointFiles, base_models: BaseModels, limits: quotas.QuotaLimits,
                 audit: AuditTrail) -> None:
        self.store = store
        self.backend = backend
        self.futures = futures
        self.scheduler = scheduler
        self.files = files
        self.base_models = base_models
        self.limits = limits
        self.audit = audit

    def submit(self, owner: str, upload: Path, base_model: str, name: str, project_id: str | None) -> Future:
        """The future of importing `upload` (which it deletes when done) as checkpoint `name` of a new run."""
        try:
            validate_name(name)
            self.base_models.info(base_model)
            config = self.backend.read_adapter_config(upload)
            quotas.check("lora_rank", 0, int(config["r"]), self.limits.lora_rank, asked="a run of this rank")
            quotas.check("checkpoint_bytes", self.store.checkpoint_bytes(owner), 1, self.limits.checkpoint_bytes,
                         asked="an import")
        except BaseException:
            upload.unlink(missing_ok=True)
            raise
        session = SessionRow(session_id=uuid.uuid4().hex, owner=owner, sdk_version=None, tags=[], user_metadata={},
                             project_id=project_id, display_name=f"import of {name}"[:256], finished_at=utcnow(),
                             finish_reason="success")
        path = TinkerPath(model_id_for(session.session_id, 0), "weights", name)
        future, _ = self.futures.create(owner, "ImportAdapter")
        self.scheduler.submit_unsequenced(Job(future, lambda: self._import(owner, upload, base_model, session,
                                                                           path)))
        return future

    def _import(self, owner: str, upload: Path, base_model: str, session: SessionRow, path: TinkerPath
                ) -> CheckpointSaved:
        try:
            lora = None

            def write(directory: Path) -> None:
                nonlocal lora
                lora = self.backend.import_adapter(upload, base_model, directory)

            self.files.write(path, write, overwrite=False)
        finally:
            upload.unlink(missing_ok=True)
        assert lora is not None
        now = utcnow()
        weights = self.base_models.provenance(base_model)  # the base it was imported onto
        run = TrainingRunRow(run_id=path.run_id, session_id=session.session_id, owner=owner, base_model=base_model,
                             lora_rank=lora.rank, lora_config=asdict(lora), user_metadata=None,
                             base_revision=weights.revision if weights else None,
                             base_fingerprint=weights.fingerprint if weights else None)
        checkpoint = CheckpointRow(run_id=path.run_id, checkpoint_id=path.checkpoint_id, kind=path.kind, owner=owner,
                                   size_bytes=tree_size(self.files.directory(path)), created_at=now, public=False,
                                   expires_at=None)
        try:
            self.store.copies.add(session, run, checkpoint)
        except BaseException:
            shutil.rmtree(self.files.directory(path), ignore_errors=True)
            raise
        self.audit.record("checkpoint_import", owner, run_id=path.run_id, tinker_path=str(path),
                          base_model=base_model, rank=lora.rank)
        logger.info("%s: imported an adapter as %s (rank %d)", owner[:8], path, lora.rank)
        return CheckpointSaved(str(path))
