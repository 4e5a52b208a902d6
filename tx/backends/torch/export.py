"""`tx checkpoints export --merge`: a checkpoint's adapter merged into its base model.

The result is a plain Hugging Face model directory (config, safetensors weights, tokenizer) that
transformers and vLLM load with no adapter support. Either checkpoint kind works: a PEFT adapter
directory (sampler_weights/, or unencrypted external_weights/) or a training state (weights/).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import peft
import torch

from tx.backends.torch import checkpoint
from tx.backends.torch.lora import peft_config_for
from tx.backends.torch.model import load_causal_lm
from tx.models.lora_targets import exact_targets, structure_of
from tx.types import UserError

logger = logging.getLogger(__name__)
ADAPTER_CONFIG = "adapter_config.json"


def checkpoint_base_model(directory: Path) -> str:
    """The name of the base model a checkpoint directory was trained on."""
    if (directory / ADAPTER_CONFIG).is_file():
        return str(json.loads((directory / ADAPTER_CONFIG).read_text())["base_model_name_or_path"])
    if any(directory.glob("*.age")):
        raise UserError(f"{directory} is age-encrypted; decrypt its files (age -d) first")
    return checkpoint.read_state_config(directory)[0]


def merge_into_base(directory: Path, base_dir: Path, out: Path) -> Path:
    """Write base + adapter of `directory`, merged, as an HF model directory `out` (must not exist)."""
    if out.exists():
        raise UserError(f"{out} already exists; choose a new output directory")
    with tempfile.TemporaryDirectory() as scratch:
        adapter = _as_peft_adapter(directory, base_dir, Path(scratch))
        model = load_causal_lm(base_dir, torch.device("cpu"))
        with exact_targets():
            merged = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        tmp = out.with_name(f".tmp-{out.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        merged.save_pretrained(str(tmp), safe_serialization=True)
        _copy_tokenizer(base_dir, tmp)
        tmp.rename(out)
    logger.info("merged %s into %s: %s", directory, base_dir, out)
    return out


def _as_peft_adapter(directory: Path, base_dir: Path, scratch: Path) -> Path:
    if (directory / ADAPTER_CONFIG).is_file():
        return directory
    base_model, lora = checkpoint.read_state_config(directory)
    weights = checkpoint.read_weights(directory, torch.device("cpu"))
    config = peft_config_for(lora, structure_of(base_dir), held=weights)
    checkpoint.write_sampler_weights(scratch, base_model, config, weights)
    return scratch


def _copy_tokenizer(base_dir: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(str(out))
    for extra in ("generation_config.json", "chat_template.jinja", "preprocessor_config.json"):
        if (base_dir / extra).is_file() and not (out / extra).exists():
            shutil.copy2(base_dir / extra, out / extra)
