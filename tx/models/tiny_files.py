"""Writing a tiny random model to a directory like a hub snapshot: the part every tiny family shares.

A tiny model is a transformers config (built with the family's own config class), random weights drawn from a
seed, the synthetic tokenizer of `tx.models.tokenizer`, and, for a vision-language model, its image
processor's config. `write_model` builds the weights from the config with the Auto classes, so every family
goes through the same code; the families only differ in their configs (`tiny.py`, `tiny_families.py`,
`tiny_vlm.py`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tx.models.tokenizer import ADDED_TOKENS, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, build_tokenizer

if TYPE_CHECKING:
    from transformers import PretrainedConfig

logger = logging.getLogger(__name__)


def token_ids(directory: Path) -> dict[str, int]:
    """Ids of the special and added tokens, read back from the tokenizer.json just written."""
    data = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    return {entry["content"]: entry["id"] for entry in data["added_tokens"]}


def special_ids(ids: dict[str, int]) -> dict[str, int]:
    """The Qwen conventions every tiny model follows: bos = pad = `<|endoftext|>`, eos = `<|im_end|>`."""
    return {"bos_token_id": ids[PAD_TOKEN], "eos_token_id": ids[EOS_TOKEN], "pad_token_id": ids[PAD_TOKEN]}


def write_tokenizer(directory: Path) -> dict[str, int]:
    """The synthetic tokenizer written into `directory`; the ids of its special and added tokens."""
    build_tokenizer(directory)
    ids = token_ids(directory)
    assert set(ids) == set(SPECIAL_TOKENS) | set(ADDED_TOKENS), "tokenizer added tokens changed"
    return ids


def write_model(
    directory: Path, config: PretrainedConfig, ids: dict[str, int], seed: int, *, name: str,
    extra_files: dict[str, Any] | None = None,
) -> Path:
    """Random weights for `config` (seeded; the global torch RNG is left untouched) written into `directory`
    with config.json, generation_config.json and `extra_files` (name -> JSON). A vision-language config (one
    with a `vision_config`) is built as AutoModelForImageTextToText, anything else as AutoModelForCausalLM."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, GenerationConfig
    from transformers.core_model_loading import revert_weight_conversion

    auto = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    vocab_size = int(config.get_text_config().vocab_size)
    if max(ids.values()) >= vocab_size:
        raise ValueError(f"tiny model {name!r} has vocab_size {vocab_size} <= the tokenizer's largest id")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto.from_config(config, dtype=torch.float32)
    config.save_pretrained(str(directory))
    GenerationConfig(**special_ids(ids)).save_pretrained(str(directory))
    for file_name, content in (extra_files or {}).items():
        (directory / file_name).write_text(json.dumps(content, indent=2) + "\n")
    # in the hub's own layout, as `save_pretrained` writes it (routed experts one tensor per expert and
    # projection): what real checkpoints look like to every reader, vLLM's included
    tensors = {key: tensor.detach().contiguous()
               for key, tensor in revert_weight_conversion(model, model.state_dict()).items()}
    weights = directory / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors creates it owner-only; a shared HF cache needs it readable
    num_parameters = model.num_parameters()
    logger.info("wrote tiny %r model (seed %d, %d parameters) to %s", name, seed, num_parameters, directory)
    return directory
