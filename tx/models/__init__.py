"""Model files for tx: tiny random models of each supported family, their synthetic tokenizer, and finding
models on disk (a hub id absent from the cache fetched from the hub first: `download.py`).

Public surface: `build_tokenizer`, `write_tiny_model` (any preset of `make_tiny`), `preset_for_name`,
`write_tiny_text_model` (the Qwen3 shapes of `PRESETS`), `write_to_hf_cache` and `resolve_model_dir`. Heavy
libraries (torch, transformers) are imported inside the functions that need them.
"""

from tx.models.hub import write_to_hf_cache
from tx.models.make_tiny import all_presets, preset_for_name, write_tiny_model
from tx.models.resolve import resolve_model_dir
from tx.models.tiny import PRESETS, TinyPreset, write_tiny_text_model
from tx.models.tokenizer import build_tokenizer

__all__ = [
    "PRESETS",
    "TinyPreset",
    "all_presets",
    "build_tokenizer",
    "preset_for_name",
    "resolve_model_dir",
    "write_tiny_model",
    "write_tiny_text_model",
    "write_to_hf_cache",
]
