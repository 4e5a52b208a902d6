"""Which base models a server serves, and where their files are."""

from __future__ import annotations

import logging
from pathlib import Path

from tx.config import DEFAULT_MODEL, Settings
from tx.models.download import split_revision
from tx.models.resolve import resolve_model_dir

logger = logging.getLogger(__name__)


def ensure_default_model(models_dir: Path) -> Path:
    """The built-in offline model, written on first start into the data directory."""
    directory = models_dir / DEFAULT_MODEL
    if not (directory / "config.json").is_file():
        from tx.models.tiny import write_tiny_text_model

        logger.info("writing the built-in model %s to %s (first start)", DEFAULT_MODEL, directory)
        tmp = models_dir / f".tmp-{DEFAULT_MODEL}"
        write_tiny_text_model(tmp, preset="tiny", seed=0)
        tmp.replace(directory)
    return directory


def resolve_served_models(settings: Settings) -> dict[str, Path]:
    """Served name -> local model directory. The name is what clients pass as `base_model`: a hub id without the
    `@revision` that pinned it. A hub id not in the cache is downloaded first unless `settings.offline`."""
    if not settings.base_models:
        return {DEFAULT_MODEL: ensure_default_model(settings.models_dir)}
    return {served_name(name): resolve_model_dir(name, offline=settings.offline) for name in settings.base_models}


def served_name(name: str) -> str:
    """`Qwen/Qwen3-8B@<revision>` is served as `Qwen/Qwen3-8B`; a local directory keeps its path."""
    return name if Path(name).expanduser().is_dir() else split_revision(name)[0]


def tokenizer_id_for(name: str, directory: Path) -> str:
    """What clients load their tokenizer from: the hub id when served by one, else the path."""
    if "/" in name and not Path(name).exists():
        return name
    return str(directory)
