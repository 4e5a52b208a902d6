"""Merges on the server: a checkpoint's adapter merged into its base model, kept as an `external_weights/`
checkpoint of its run (`tx checkpoints merge`, `POST /api/v1/tx/checkpoints/merge`), which `tinker checkpoint
download` then fetches file by file with signed links.

Rules:
- The caller merges their own checkpoints (training state, sampler weights, or unencrypted external weights); a
  published one of another key's is copied first (`copy_weights`), so the merged model is the caller's.
- The merge streams the base model shard by shard where it can (`tx/backends/torch/merge.py`), on a thread of its
  own: neither the event loop nor the training thread waits for it, and one merge runs at a time.
- It counts in the key's `checkpoint_bytes` quota (checked at submission, as a save is), is written atomically
  (`files.py`) and recorded after, and goes into the audit log as `checkpoint_merge`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

from tx.core import quotas
from tx.core.checkpoints.catalog import CheckpointCatalog
from tx.core.checkpoints.files import TinkerPath, validate_name, validate_ttl
from tx.core.futures import Future, FutureRegistry
from tx.core.results import ExternalSaved
from tx.store.tables import CheckpointRow, utcnow
from tx.types import ErrorCategory, NotFoundError, UserError

logger = logging.getLogger(__name__)
Merge = Callable[[Path, Path, Path], object]
"""(checkpoint directory, base model directory, new output directory): the merged HF model written there."""
MERGED_KINDS = ("weights", "sampler_weights", "external_weights")


class ServerMerges:
    def __init__(self, catalog: CheckpointCatalog, futures: FutureRegistry, models: Mapping[str, Path],
                 merge: Merge, limits: quotas.QuotaLimits) -> None:
        self.catalog = catalog
        self.store = catalog.store
        self.futures = futures
        self.models = models
        self.merge = merge
        self.limits = limits
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tx-merge")

    def submit(self, owner: str, source_path: str, name: str, ttl_s: int | None) -> Future:
        """The future of merging `source_path` into `tinker://<its run>/external_weights/<name>`."""
        validate_name(name)
        validate_ttl(ttl_s)
        source, run = self.catalog.readable(owner, source_path, kinds=MERGED_KINDS)
        if run.owner != owner:
            raise UserError(f"{source} is another key's published checkpoint: copy it first (copy_weights), then "
                            "merge your copy")
        if run.base_model not in self.models:
            raise NotFoundError(f"base model {run.base_model!r} of {source} is not served here")
        quotas.check("checkpoint_bytes", self.store.checkpoint_bytes(owner), 1, self.limits.checkpoint_bytes,
                     asked="a merge")
        dest = TinkerPath(source.run_id, "external_weights", name)
        if self.catalog.files.directory(dest).exists():
            raise UserError(f"checkpoint {dest} already exists; choose another name or delete it first")
        future, _ = self.futures.create(owner, "MergeCheckpoint", track=source.run_id)
        self._worker.submit(self._run, future, owner, source, dest, self.models[run.base_model], ttl_s)
        return future

    def _run(self, future: Future, owner: str, source: TinkerPath, dest: TinkerPath, base_dir: Path,
             ttl_s: int | None) -> None:
        if not self.futures.start(future):
            return  # cancelled while it waited
        try:
            self.futures.resolve(future, self._merge(owner, source, dest, base_dir, ttl_s))
        except Exception as exc:  # noqa: BLE001 - every failure answers the future; the worker stays up
            if self.futures.fail_with(future, exc) == ErrorCategory.SERVER:
                logger.exception("merging %s failed", source)

    def _merge(self, owner: str, source: TinkerPath, dest: TinkerPath, base_dir: Path, ttl_s: int | None
               ) -> ExternalSaved:
        directory = self.catalog.files.require(source)

        def write(tmp: Path) -> None:
            merged = tmp / "merged"
            self.merge(directory, base_dir, merged)
            for file in merged.iterdir():  # the checkpoint's files at its root, as an export's are
                file.rename(tmp / file.name)
            merged.rmdir()

        size = self.catalog.files.write(dest, write, overwrite=False)
        now = utcnow()
        row = CheckpointRow(run_id=dest.run_id, checkpoint_id=dest.checkpoint_id, kind=dest.kind, owner=owner,
                            size_bytes=size, created_at=now, public=False,
                            expires_at=now + timedelta(seconds=ttl_s) if ttl_s is not None else None)
        try:
            self.store.add_checkpoint(row, overwrite=False)
        except BaseException:
            shutil.rmtree(self.catalog.files.directory(dest), ignore_errors=True)
            raise
        self.catalog.audit.record("checkpoint_merge", owner, run_id=dest.run_id, tinker_path=str(dest),
                                  source=str(source), size_bytes=size)
        logger.info("%s: merged %s into its base model as %s (%.1f MiB)", owner[:8], source, dest, size / 2**20)
        return ExternalSaved(path=str(dest), size_bytes=size)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
