"""Find a model's files: a local directory, or a hub id (`org/name`, or `org/name@revision`) in the local
Hugging Face cache, downloaded into it first when it is not there (`tx/models/download.py`).

Offline (`HF_HUB_OFFLINE=1`, or `offline=True`: `tx serve --offline`) tx downloads nothing: a hub id must already
be in the cache (`tx models make-tiny <name>` puts a tiny random model there). The cache location is read from
the environment at call time (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
`~/.cache/huggingface/hub`), not from huggingface_hub's constants, which are frozen when it is first imported.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tx.types import NotFoundError

logger = logging.getLogger(__name__)


def hf_hub_cache_dir() -> Path:
    """The hub cache directory the environment selects right now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def hub_offline() -> bool:
    """Whether the environment forbids the hub (`HF_HUB_OFFLINE`, as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def resolve_model_dir(name_or_path: str, offline: bool = False) -> Path:
    """The directory holding the files of `name_or_path` (config.json, weights, tokenizer).

    An existing local directory is returned as is. Anything else is taken as a hub id, `@revision` pinning a
    branch, tag or commit (default main), and looked up in the local hub cache; a complete snapshot there is used
    without the network. One that is absent (or that an interrupted download left incomplete) is downloaded,
    unless `offline` or `HF_HUB_OFFLINE` says not to: then NotFoundError names the cache searched and the command
    that creates a tiny stand-in. A download that fails raises `download.ModelUnavailable` (a NotFoundError).
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    from tx.models.download import ALLOW_PATTERNS, IGNORE_PATTERNS, fetch_model, split_revision

    repo_id, revision = split_revision(name_or_path)
    cache_dir = hf_hub_cache_dir()
    try:  # IncompleteSnapshotError is a LocalEntryNotFoundError: files listed by the hub are missing
        snapshot = snapshot_download(repo_id, revision=revision, cache_dir=str(cache_dir), local_files_only=True,
                                     allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS)
    except HFValidationError as err:
        raise NotFoundError(f"model {name_or_path!r} is neither a local directory nor a hub id (org/name or "
                            "org/name@revision): give the path of a model directory, or the model's hub id") from err
    except (LocalEntryNotFoundError, FileNotFoundError) as err:
        if offline or hub_offline():
            raise NotFoundError(
                f"model {name_or_path!r} is not in the Hugging Face cache at {cache_dir} and tx is offline "
                "(--offline or HF_HUB_OFFLINE=1): drop that to download it, set HF_HOME or HF_HUB_CACHE to the cache "
                f"that holds it, or write a tiny stand-in there with: tx models make-tiny {repo_id}") from err
        return fetch_model(repo_id, revision, cache_dir)
    logger.debug("resolved model %s to %s", name_or_path, snapshot)
    return Path(snapshot)

