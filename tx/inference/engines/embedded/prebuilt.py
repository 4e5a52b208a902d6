"""What a standby engine builds before its config arrives, for the models the server serves, and the engine that
then serves one of them takes instead of building it again: the tokenizer (its first load also imports
transformers' tokenizer classes, seconds on a busy machine) and uvicorn's protocol classes. Nothing here opens a
model's weights: a standby that never becomes an engine holds no model (`tx/inference/launch/standby.py`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

_tokenizers: dict[Path, PreTrainedTokenizerBase | None] = {}  # model dir (resolved) -> built by `prebuild`


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase | None:
    """The model dir's tokenizer, or None when it has none."""
    if not any((model_dir / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def prebuild(model_dirs: list[Path]) -> None:
    """Build ahead what the engine of each of `model_dirs` would build first (a warm-up: a failure is the real
    load's to report)."""
    import uvicorn
    from fastapi import FastAPI

    uvicorn.Config(FastAPI()).load()  # imports the HTTP and lifespan protocol classes the engine's server uses
    for model_dir in model_dirs:
        try:
            _tokenizers[model_dir.resolve()] = load_tokenizer(model_dir)
        except Exception:  # noqa: BLE001
            logger.debug("standby: no tokenizer built for %s", model_dir, exc_info=True)


def take_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase | None:
    """The tokenizer `prebuild` built for `model_dir` (once), else a new one."""
    key = model_dir.resolve()
    return _tokenizers.pop(key) if key in _tokenizers else load_tokenizer(model_dir)


__all__ = ["load_tokenizer", "prebuild", "take_tokenizer"]
