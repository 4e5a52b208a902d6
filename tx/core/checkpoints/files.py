"""Checkpoint paths and their on-disk layout, with atomic writes.

A checkpoint is named `tinker://<run_id>/<kind>/<name>` and lives in
`<checkpoints_dir>/<run_id>/<kind>/<name>/`. It is written into a temporary sibling directory
(`.tmp-<name>-<hex>`), flushed to disk, and renamed into place, so a crash never leaves a
half-written checkpoint under a real name. Overwriting moves the old one aside first
(`.old-<name>-<hex>`). A crash (SIGKILL) can leave either behind; `sweep` runs at startup and
removes them, putting an `.old-` copy back when the crash came between the two renames.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tx.types import UserError

KINDS = ("weights", "sampler_weights", "external_weights")
CHECKPOINT_TYPE: dict[str, Literal["training", "sampler", "external"]] = {
    "weights": "training", "sampler_weights": "sampler", "external_weights": "external",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,199}$")
_LEFTOVER = re.compile(r"^\.(tmp|old)-(.+)-[0-9a-f]{8}$")
MIN_TTL_S, MAX_TTL_S = 3600, 10 * 365 * 24 * 3600


@dataclass(frozen=True)
class TinkerPath:
    run_id: str
    kind: str
    name: str

    @property
    def checkpoint_id(self) -> str:
        return f"{self.kind}/{self.name}"

    def __str__(self) -> str:
        return f"tinker://{self.run_id}/{self.kind}/{self.name}"

    @classmethod
    def parse(cls, path: str) -> TinkerPath:
        if not path.startswith("tinker://"):
            raise UserError(f"not a tinker path (expected tinker://<run>/<kind>/<name>): {path!r}")
        parts = path[len("tinker://"):].split("/")
        if len(parts) != 3 or not all(parts):
            raise UserError(f"malformed tinker path (expected tinker://<run>/<kind>/<name>): {path!r}")
        run_id, kind, name = parts
        if kind not in KINDS:
            raise UserError(f"unknown checkpoint kind {kind!r} in {path!r}; expected one of {KINDS}")
        validate_name(name)
        return cls(run_id, kind, name)


def validate_name(name: str) -> None:
    if not _NAME.match(name):
        raise UserError(
            f"invalid checkpoint name {name!r}: use 1-200 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def validate_ttl(ttl_s: int | None) -> None:
    if ttl_s is not None and not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise UserError(f"ttl_seconds must be between {MIN_TTL_S} (1 hour) and {MAX_TTL_S} (10 years), got {ttl_s}")


class CheckpointFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    def directory(self, path: TinkerPath) -> Path:
        return self.root / _safe(path.run_id) / path.kind / path.name

    def write(self, path: TinkerPath, writer: Callable[[Path], None], *, overwrite: bool) -> int:
        """Run `writer(tmp_dir)`, then move the result into place atomically. Returns its size."""
        final = self.directory(path)
        if final.exists() and not overwrite:
            raise UserError(f"checkpoint {path} already exists (pass overwrite=True to replace it)")
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{path.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            writer(tmp)
            _fsync_tree(tmp)
            if final.exists():
                trash = final.parent / f".old-{path.name}-{uuid.uuid4().hex[:8]}"
                os.replace(final, trash)
                os.replace(tmp, final)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.replace(tmp, final)
            _fsync_dir(final.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return tree_size(final)

    def link_copy(self, source: TinkerPath, dest: TinkerPath) -> int:
        """Make `dest` a copy of `source` that shares its bytes: every file hard-linked (checkpoint files are
        never changed in place, only replaced by a new directory), so deleting either leaves the other whole.
        Returns the copy's size."""
        root = self.require(source)

        def link(tmp: Path) -> None:
            for file in sorted(root.rglob("*")):
                if file.is_symlink():
                    continue
                target = tmp / file.relative_to(root)
                if file.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.link(file, target)

        return self.write(dest, link, overwrite=False)

    def uploads_dir(self) -> Path:
        """Where uploads wait to become checkpoints (`imports.py`): beside them, so a state is renamed into
        place, not copied. Emptied by `sweep`."""
        directory = self.root / ".uploads"
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def sweep(self) -> int:
        """Remove what a crashed write or import left behind; returns how many leftovers were handled."""
        handled = 0
        uploads = self.root / ".uploads"
        if uploads.is_dir():
            handled += sum(1 for _ in uploads.iterdir())
            shutil.rmtree(uploads, ignore_errors=True)
        for kind_dir in (d for kind in KINDS for d in self.root.glob(f"*/{kind}")):
            for entry in sorted(kind_dir.iterdir()):  # `.old-` sorts before `.tmp-`
                match = _LEFTOVER.match(entry.name)
                if match is None or not entry.is_dir():
                    continue
                final = kind_dir / match.group(2)
                if match.group(1) == "old" and not final.exists():
                    os.replace(entry, final)  # killed between moving it aside and moving the new one in
                else:
                    shutil.rmtree(entry, ignore_errors=True)
                handled += 1
        return handled

    def ephemeral_dir(self, run_id: str, version: int) -> Path:
        """Unnamed sampler weights (save_weights_and_get_sampling_client): not listed as checkpoints."""
        return self.root / _safe(run_id) / "ephemeral" / str(version)

    def delete(self, path: TinkerPath) -> None:
        shutil.rmtree(self.directory(path), ignore_errors=True)

    def files(self, path: TinkerPath) -> dict[str, Path]:
        """Every regular file of a checkpoint, by its path relative to the checkpoint's root."""
        root = self.require(path)
        return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}

    def require(self, path: TinkerPath) -> Path:
        directory = self.directory(path)
        if not directory.is_dir():
            raise UserError(f"checkpoint {path} has no files on this server")
        return directory


def tree_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _safe(run_id: str) -> str:
    if "/" in run_id or run_id in ("", ".", ".."):
        raise UserError(f"invalid training run id {run_id!r}")
    return run_id


def _fsync_tree(directory: Path) -> None:
    for p in directory.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
