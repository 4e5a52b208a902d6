"""Which attention implementation a model runs with: the best one its family supports on the device.

transformers says per model class what it supports (`_supports_sdpa`, `_supports_flash_attn`,
`_supports_flex_attn`), and refuses an implementation a class lacks. gpt-oss, for one, has no SDPA (its
attention sinks need eager, flex or a sink-aware kernel). Preference, first supported wins:

- CUDA in 16-bit: FlashAttention 2 (when `flash_attn` is installed), SDPA, flex attention, eager;
- CUDA in float32: SDPA, flex attention, eager;
- CPU: SDPA, eager (flex attention runs uncompiled on CPU, materialising the scores, and refuses sinks).

The trainer and the embedded engine both ask here, so sampler and trainer run the same math. A user can
force one (`--attn-implementation`); transformers then refuses it at load when the family lacks it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from tx.config.names import AttnImplementation

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_SUPPORT_FLAGS: dict[AttnImplementation, str] = {
    "sdpa": "_supports_sdpa",
    "flex_attention": "_supports_flex_attn",
    "flash_attention_2": "_supports_flash_attn",
}


def preferences(device_type: str, half_precision: bool) -> list[AttnImplementation]:
    """The implementations to try on `device_type` ("cpu", "cuda"), best first."""
    if device_type != "cuda":
        return ["sdpa", "eager"]
    best: list[AttnImplementation] = ["sdpa", "flex_attention", "eager"]
    if half_precision and importlib.util.find_spec("flash_attn") is not None:
        best.insert(0, "flash_attention_2")
    return best


def supports(model_class: type[PreTrainedModel], implementation: AttnImplementation) -> bool:
    """Whether `model_class` declares `implementation` (eager always; flash 3 as flash 2)."""
    if implementation == "eager":
        return True
    flag = _SUPPORT_FLAGS.get(implementation, "_supports_flash_attn")
    return bool(getattr(model_class, flag, False))


def choose_attention(
    model_dir: Path, device_type: str, half_precision: bool, override: AttnImplementation | None = None
) -> AttnImplementation:
    """`override`, or the first of `preferences` the model class in `model_dir` supports."""
    if override is not None:
        return override
    from tx.models.auto import model_class

    cls = model_class(model_dir)
    return next(impl for impl in preferences(device_type, half_precision) if supports(cls, impl))
