"""Loading a model directory: which transformers class (a causal LM, or a vision-language model), and the
one way tx loads a frozen base model (the trainer and the embedded engine differ only in the parameters)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


def is_vision_language(model_dir: Path) -> bool:
    """Whether the config in `model_dir` describes a vision-language model (it has a `vision_config`)."""
    return "vision_config" in json.loads((Path(model_dir) / "config.json").read_text())


def _auto_class(model_dir: Path) -> type[Any]:
    """AutoModelForImageTextToText for a vision-language model (Qwen2-VL ... Qwen3.5: their generation
    class), AutoModelForCausalLM otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(model_dir) else AutoModelForCausalLM


def load_pretrained(model_dir: Path, **kwargs: Any) -> PreTrainedModel:
    """`from_pretrained` with the model's generation class (`_auto_class`)."""
    return _auto_class(model_dir).from_pretrained(str(model_dir), **kwargs)


def model_class(model_dir: Path) -> type[PreTrainedModel]:
    """The class `load_pretrained` would build for `model_dir`, from its config alone (no weights)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    mapping = _auto_class(model_dir)._model_mapping
    return mapping[type(config)]


def load_frozen(model_dir: Path, device: torch.device, dtype: torch.dtype, attn_implementation: str, *,
                private_copy: bool = False) -> PreTrainedModel:
    """The model in `model_dir` with base weights in `dtype` on `device`, frozen (no gradients) and in eval
    mode (no dropout: every pass is deterministic).

    `private_copy` (on cpu): copy every parameter into private memory. Loaded safetensors are lazily paged
    views of the file: they would make RSS depend on which rows a forward touched, and change if the file
    were rewritten in place. On another device `.to(device)` copies anyway.

    The load is tracked (`tx/models/loading.py`): the log and `/api/v1/healthz` show its progress."""
    from tx.models.loading import loading

    with loading(model_dir):
        model = load_pretrained(model_dir, dtype=dtype, attn_implementation=attn_implementation)
    model.eval().requires_grad_(False)
    if private_copy and device.type == "cpu":
        for param in model.parameters():
            param.data = param.data.clone()
    else:
        model.to(device)  # pyright: ignore[reportArgumentType]  (transformers wraps .to with functools.wraps, which hides self)
    return model
