"""copy_weights: a checkpoint copied into the caller's project, or into one of the caller's sessions.

Rules (as the SDK describes them):
- The source is any checkpoint the reader may load: their own, or a published one. The reader is the caller,
  or the owner of the `weights_access_token` (a key or token of another tenant, handed over on purpose).
- The copy belongs to the caller, in a new training run that holds only it and is never trained: with a
  project, a new session of the caller's in that project (finished at once) and its run 0; with a session,
  that session's run `model_seq_id`, which must not exist yet. It keeps the source's kind and name.
- The copy shares the source's bytes (hard links, `CheckpointFiles.link_copy`): nothing is duplicated, and
  deleting or expiring the source leaves the copy whole (and the other way round).
- It counts in the caller's `checkpoint_bytes` quota, checked as for a save (tx/core/quotas.py).
- Its TTL is the request's (none: it never expires); the source's expiry is not inherited. It is not public.
- One copy per idempotency key (`X-Idempotency-Key`, stable across the SDK's retries): a repeat answers the
  first copy's path.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.exc import IntegrityError

from tx.core import quotas
from tx.core.checkpoints.catalog import CheckpointCatalog
from tx.core.checkpoints.files import KINDS, TinkerPath, validate_ttl
from tx.store.store import Store
from tx.store.tables import CheckpointRow, SessionRow, TrainingRunRow, utcnow
from tx.types import ConflictError, UserError, model_id_for


@dataclass(frozen=True)
class CopyTarget:
    """Where a copy goes: a project (`project_id`), or a session's run (`session_id`, `model_seq_id`)."""

    project_id: str | None = None
    session_id: str | None = None
    model_seq_id: int | None = None


class WeightCopies:
    def __init__(self, store: Store, catalog: CheckpointCatalog, limits: quotas.QuotaLimits | None = None) -> None:
        self.store = store
        self.catalog = catalog
        self.limits = limits or quotas.QuotaLimits()

    def copy(self, owner: str, source_path: str, target: CopyTarget, ttl_s: int | None, request_key: str | None,
             reader: str | None = None) -> str:
        """The tinker path of the copy (of an earlier copy made for the same `request_key`)."""
        validate_ttl(ttl_s)
        if request_key and (made := self.store.copies.made_for(owner, request_key)) is not None:
            return _path_of(made)
        source, source_run = self.catalog.readable(reader or owner, source_path, kinds=KINDS)
        # a copy counts in the caller's checkpoint_bytes, as a save does (one that crosses it is kept)
        quotas.check("checkpoint_bytes", self.store.checkpoint_bytes(owner), 1, self.limits.checkpoint_bytes,
                     asked="a copy")
        session, run_id = self._destination(owner, target, source)
        dest = TinkerPath(run_id, source.kind, source.name)
        size = self.catalog.files.link_copy(source, dest)
        now = utcnow()
        run = TrainingRunRow(run_id=run_id, session_id=session.session_id if session else target.session_id,
                             owner=owner, base_model=source_run.base_model, lora_rank=source_run.lora_rank,
                             lora_config=dict(source_run.lora_config), user_metadata=None,
                             copied_from=str(source), copy_request=request_key or None,
                             base_revision=source_run.base_revision, base_fingerprint=source_run.base_fingerprint)
        checkpoint = CheckpointRow(run_id=run_id, checkpoint_id=dest.checkpoint_id, kind=dest.kind, owner=owner,
                                   size_bytes=size, created_at=now, public=False,
                                   expires_at=now + timedelta(seconds=ttl_s) if ttl_s is not None else None)
        try:
            self.store.copies.add(session, run, checkpoint)
        except (ConflictError, IntegrityError):
            self.catalog.files.delete(dest)
            if request_key and (made := self.store.copies.made_for(owner, request_key)) is not None:
                return _path_of(made)  # the same request, retried while the first was being made
            raise ConflictError(f"training run {run_id!r} already exists") from None
        self.catalog.audit.record("checkpoint_copy", owner, subject_owner=source_run.owner, run_id=source.run_id,
                                  tinker_path=str(source), copy=str(dest), with_access_token=reader is not None)
        return str(dest)

    def _destination(self, owner: str, target: CopyTarget, source: TinkerPath) -> tuple[SessionRow | None, str]:
        """(the new session to record, or None for an existing one; the copy's run id)."""
        if target.session_id is not None:
            if target.model_seq_id is None or target.model_seq_id < 0:
                raise UserError("copying into a session needs its model_seq_id (>= 0) too")
            self.store.get_session(target.session_id, owner)  # 404 unless the caller's
            run_id = model_id_for(target.session_id, target.model_seq_id)
            if run_id in self.store.runs_of_session(target.session_id):
                raise ConflictError(f"training run {run_id!r} already exists; copy into an unused model_seq_id")
            return None, run_id
        if not target.project_id:
            raise UserError("copy_weights needs destination_project_id, or session_id and model_seq_id")
        session = SessionRow(session_id=uuid.uuid4().hex, owner=owner, sdk_version=None, tags=[], user_metadata={},
                             project_id=target.project_id, display_name=f"copy of {source}"[:256],
                             finished_at=utcnow(), finish_reason="success")
        return session, model_id_for(session.session_id, 0)


def _path_of(run: TrainingRunRow) -> str:
    assert run.copied_from is not None
    return str(TinkerPath(run.run_id, *TinkerPath.parse(run.copied_from).checkpoint_id.split("/", 1)))
