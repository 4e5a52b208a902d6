"""Lay out a tiny model in a Hugging Face hub cache, under a hub name such as `Qwen/Qwen3-8B`.

With `HF_HOME=<hf_home> HF_HUB_OFFLINE=1`, `AutoTokenizer.from_pretrained("Qwen/Qwen3-8B")` and
`AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-8B")` then load the tiny files by name. This is how tx and
an unchanged tinker client (or tinker-cookbook recipe) find the same tokenizer offline
(docs/cookbook.md#tokenizers-and-models-offline). The layout is the hub cache's:

    <hf_home>/hub/models--Org--Name/refs/main            (a 40-hex commit-like string)
    <hf_home>/hub/models--Org--Name/snapshots/<commit>/  (config.json, model.safetensors, tokenizer.json, ...)

The files are stored directly in the snapshot (no blobs/ symlinks), which the hub libraries accept.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from tx.models.make_tiny import preset_for_name, write_tiny_model

logger = logging.getLogger(__name__)


def validate_hub_name(name: str) -> tuple[str, str]:
    """Split an `org/name` hub id into (org, name); raise ValueError if it is not a valid one."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name.count("/") != 1:
        raise ValueError(f"hub model name must have the form 'org/name' (e.g. 'Qwen/Qwen3-8B'), got {name!r}")
    try:
        validate_repo_id(name)
    except HFValidationError as err:
        raise ValueError(f"invalid hub model name {name!r}: {err}") from err
    org, repo = name.split("/")
    return org, repo


def fake_commit(name: str) -> str:
    """The 40-hex commit-like string recorded in refs/main for `name` (a function of the name only)."""
    return hashlib.sha1(f"tx-tiny-model:{name}".encode()).hexdigest()


def _replace_dir(new: Path, target: Path) -> None:
    """Move the finished directory `new` to `target`, replacing whatever was there."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_ref(ref_file: Path, commit: str) -> None:
    """Write refs/main atomically (temp file, then rename)."""
    ref_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref_file.with_name(f".{ref_file.name}.tmp-{os.getpid()}")
    tmp.write_text(commit, encoding="utf-8")
    os.replace(tmp, ref_file)


def write_to_hf_cache(name: str, hf_home: Path, preset: str | None = None, seed: int = 0) -> Path:
    """Write a tiny model of `preset` (None: the family `name` says, `make_tiny.preset_for_name`) under hub id
    `name` in `<hf_home>/hub`; return its snapshot directory.

    The snapshot is built in a temporary directory next to it and renamed into place, so overwriting an
    existing entry never leaves a half-written one. Raises ValueError for a name not of the form `org/name`.
    """
    org, repo = validate_hub_name(name)
    preset = preset or preset_for_name(name)
    repo_dir = Path(hf_home) / "hub" / f"models--{org}--{repo}"
    commit = fake_commit(name)
    snapshot = repo_dir / "snapshots" / commit
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{commit}.tmp-", dir=snapshot.parent))
    try:
        write_tiny_model(staging, preset=preset, seed=seed)
        staging.chmod(0o755)
        _replace_dir(staging, snapshot)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _write_ref(repo_dir / "refs" / "main", commit)
    logger.info("cached tiny %r model as %s at %s", preset, name, snapshot)
    return snapshot
