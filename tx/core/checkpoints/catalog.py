"""The checkpoint catalog: listing, TTLs, publishing, deletion, and download links.

Rules:
- A checkpoint belongs to the key that saved it. Only that key lists, deletes, publishes or
  changes the TTL of it; any other key gets 404, as if it did not exist.
- A published checkpoint can also be loaded and sampled by any key (`readable`), and by nobody else
  before it is published or after it is unpublished.
- An expired checkpoint is gone at once from every list and read; the sweeper
  (`delete_expired`) then removes its row and frees its files.
- Deleting removes the row first, then the files, so a failed delete never leaves a listed
  checkpoint without files. The engines drop its weight versions (`Revoker`), so no sampling client made
  from it, the owner's or another key's, samples it again.
- Unpublishing ends other keys' access at once, their sampling clients included: every sample of a client
  made from a checkpoint checks that its key may still read it (`Samplers.check_access`).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Protocol

from tx.core.audit import SERVER, AuditTrail
from tx.core.checkpoints.downloads import DownloadSigner, LinkScope
from tx.core.checkpoints.files import CheckpointFiles, TinkerPath, validate_ttl
from tx.core.views import CheckpointView
from tx.store.store import Store
from tx.store.tables import TrainingRunRow
from tx.types import NotFoundError, UserError


class Revoker(Protocol):
    """Who holds a checkpoint's weights in memory (the engine manager's weight versions)."""

    def revoke(self, directory: Path, reason: str) -> None: ...


class CheckpointCatalog:
    def __init__(self, store: Store, files: CheckpointFiles, signer: DownloadSigner,
                 engines: Revoker | None = None, audit: AuditTrail | None = None) -> None:
        self.store = store
        self.files = files
        self.signer = signer
        self._engines = engines
        self.audit = audit or AuditTrail(store)

    def readable(self, owner: str, path: str, kinds: tuple[str, ...],
                 purpose: str | None = None) -> tuple[TinkerPath, TrainingRunRow]:
        """A checkpoint the caller may load or sample (its own, or a published one), and its run. With a
        `purpose` (load, sample), the read goes into the audit log."""
        parsed = TinkerPath.parse(path)
        if parsed.kind not in kinds:
            raise UserError(f"{path} is a {parsed.kind} checkpoint; this call needs one of {kinds}")
        row = self.store.get_checkpoint(parsed.run_id, parsed.checkpoint_id, owner, public_ok=True)
        if purpose is not None:
            self.audit.record("checkpoint_read", owner, subject_owner=row.owner, run_id=parsed.run_id,
                              tinker_path=str(parsed), purpose=purpose)
        return parsed, self.store.get_run(parsed.run_id, row.owner)

    def list_for_user(self, owner: str, limit: int, offset: int) -> tuple[list[CheckpointView], int]:
        rows, total = self.store.list_user_checkpoints(owner, limit, offset)
        return [CheckpointView.of(row) for row in rows], total

    def set_ttl(self, owner: str, run_id: str, checkpoint_id: str, ttl_s: int | None) -> None:
        """Expire `ttl_s` seconds from now, or never (None)."""
        _path(run_id, checkpoint_id)
        validate_ttl(ttl_s)
        expires = datetime.now(timezone.utc) + timedelta(seconds=ttl_s) if ttl_s is not None else None
        self.store.update_checkpoint(run_id, checkpoint_id, owner, expires_at=expires)
        self.audit.record("checkpoint_ttl_set", owner, run_id=run_id, tinker_path=str(_path(run_id, checkpoint_id)),
                          ttl_seconds=ttl_s)

    def set_public(self, owner: str, run_id: str, checkpoint_id: str, public: bool) -> None:
        path = _path(run_id, checkpoint_id)
        if path.kind == "external_weights" and public:
            raise UserError("external weights are downloaded with signed URLs; publish the weights/ or "
                            "sampler_weights/ checkpoint instead")
        self.store.update_checkpoint(run_id, checkpoint_id, owner, public=public)
        self.audit.record("checkpoint_publish" if public else "checkpoint_unpublish", owner, run_id=run_id,
                          tinker_path=str(path))

    def delete(self, owner: str, run_id: str, checkpoint_id: str) -> None:
        self._delete(owner, run_id, checkpoint_id, "checkpoint_delete", owner)

    def delete_expired(self) -> int:
        expired = self.store.expired_checkpoints(datetime.now(timezone.utc))
        for row in expired:
            self._delete(row.owner, row.run_id, row.checkpoint_id, "checkpoint_expire", SERVER)
        return len(expired)

    def _delete(self, owner: str, run_id: str, checkpoint_id: str, event: str, actor: str) -> None:
        path = _path(run_id, checkpoint_id)
        self.store.delete_checkpoint(run_id, checkpoint_id, owner)
        if self._engines is not None and path.kind in ("weights", "sampler_weights"):
            why = "expired" if event == "checkpoint_expire" else "was deleted by its owner"
            self._engines.revoke(self.files.directory(path), f"{path} {why}; sampling clients made from it can no "
                                 "longer sample")
        self.files.delete(path)
        self.audit.record(event, actor, subject_owner=owner, run_id=run_id, tinker_path=str(path))

    # -- download links ---------------------------------------------------------------------
    def external_weights_links(self, owner: str, run_id: str, checkpoint_id: str) -> tuple[dict[str, str], datetime]:
        """({relative path: link token}, expiry) for every file of an external-weights checkpoint."""
        path = _path(run_id, checkpoint_id)
        if path.kind != "external_weights":
            raise UserError(f"{path} is not an external_weights checkpoint; export one with save_weights_external")
        row = self.store.get_checkpoint(run_id, checkpoint_id, owner)
        tokens, expires = {}, 0.0
        for name in self.files.files(path):
            tokens[name], expires = self.signer.sign(LinkScope(
                kind="file", owner=owner, run_id=run_id, checkpoint_id=checkpoint_id,
                creation_id=row.creation_id, file=name,
            ))
        if not tokens:
            raise NotFoundError(f"checkpoint {path} has no files")
        self.audit.record("checkpoint_read", owner, run_id=run_id, tinker_path=str(path), purpose="download")
        return tokens, datetime.fromtimestamp(expires, timezone.utc)

    def linked_file(self, scope: LinkScope) -> Path:
        """The file a verified link names, if the very checkpoint it was made for still exists and has not
        expired (not one saved again under its name since)."""
        if scope.kind != "file":
            raise NotFoundError("not a checkpoint file link")
        row = self.store.get_checkpoint(scope.run_id, scope.checkpoint_id, scope.owner)
        if row.creation_id != scope.creation_id:
            raise NotFoundError(f"tinker://{scope.run_id}/{scope.checkpoint_id} was saved again since this link "
                                "was made; ask for new URLs")
        found = self.files.files(_path(scope.run_id, scope.checkpoint_id)).get(scope.file)
        if found is None or found.is_symlink():
            raise NotFoundError(f"file {scope.file!r} is no longer in tinker://{scope.run_id}/{scope.checkpoint_id}")
        return found


def _path(run_id: str, checkpoint_id: str) -> TinkerPath:
    return TinkerPath.parse(f"tinker://{run_id}/{checkpoint_id}")
