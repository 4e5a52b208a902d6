"""Which transformers class loads a model directory: a causal LM, or a vision-language model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def is_vision_language(model_dir: Path) -> bool:
    """Whether the config in `model_dir` describes a vision-language model (it has a `vision_config`)."""
    return "vision_config" in json.loads((Path(model_dir) / "config.json").read_text())


def load_pretrained(model_dir: Path, **kwargs: Any) -> PreTrainedModel:
    """`from_pretrained` with AutoModelForImageTextToText for a vision-language model (Qwen2-VL, Qwen2.5-VL,
    Qwen3-VL: their generation class), AutoModelForCausalLM otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if is_vision_language(model_dir) else AutoModelForCausalLM
    return auto.from_pretrained(str(model_dir), **kwargs)
