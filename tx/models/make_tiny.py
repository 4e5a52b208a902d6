"""`write_tiny_model`: any tiny model by preset name (`tx models make-tiny --preset`): a text preset of
`tiny.PRESETS`, or "vlm" (`tiny_vlm.py`, which builds on the text presets)."""

from __future__ import annotations

from pathlib import Path

from tx.models.tiny import write_tiny_text_model
from tx.models.tiny_vlm import write_tiny_vlm


def write_tiny_model(directory: Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the tiny model called `preset`: a text preset of `PRESETS`, or "vlm" (a tiny Qwen3-VL)."""
    if preset == "vlm":
        return write_tiny_vlm(directory, seed=seed)
    return write_tiny_text_model(directory, preset=preset, seed=seed)
