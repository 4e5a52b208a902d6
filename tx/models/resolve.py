"""Find a model's files: a local directory, or a hub id already in the local Hugging Face cache.

tx never downloads: a hub id must already be in the cache (`tx models make-tiny <name>` puts a tiny random
model there). The cache location is read from the environment at call time (`HF_HUB_CACHE`, else
`HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`), not from
huggingface_hub's constants, which are frozen when it is first imported.
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


def resolve_model_dir(name_or_path: str) -> Path:
    """The directory holding the files of `name_or_path` (config.json, weights, tokenizer).

    An existing local directory is returned as is. Anything else is taken as a hub id and looked up in the
    local hub cache only (the `main` ref), never on the network. Raises NotFoundError, naming the cache
    searched and the command that creates a tiny stand-in, when it is not there.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache_dir = hf_hub_cache_dir()
    try:
        snapshot = snapshot_download(name_or_path, cache_dir=str(cache_dir), local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError) as err:
        raise NotFoundError(
            f"model {name_or_path!r} is neither a local directory nor in the Hugging Face cache "
            f"at {cache_dir} "
            f"(set HF_HOME or HF_HUB_CACHE to choose the cache; tx never downloads). "
            f"Create a tiny stand-in with: tx models make-tiny {name_or_path}"
        ) from err
    logger.debug("resolved model %s to %s", name_or_path, snapshot)
    return Path(snapshot)
