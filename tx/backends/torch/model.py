"""Base models: where they live, what clients are told about them, and loading each one once.

A served base model is a local Hugging Face model directory (config.json + weights). Its
`BaseModelInfo` comes from the config alone, so listing models never loads weights; the weights
are loaded on the first run created on that model and then shared by every run on it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoConfig, PreTrainedModel

from tx.models.auto import load_frozen
from tx.types import BaseModelInfo

logger = logging.getLogger(__name__)


def read_model_info(name: str, path: Path) -> BaseModelInfo:
    """What clients are told about the model in `path`, read from its config.json."""
    config = AutoConfig.from_pretrained(path)
    text_config = config.get_text_config()
    architectures = getattr(config, "architectures", None) or []
    if not architectures:
        raise ValueError(f"{path}/config.json names no architectures")
    return BaseModelInfo(
        name=name,
        arch=architectures[0],
        tokenizer_id=str(path),
        vocab_size=int(text_config.vocab_size),
        max_context_length=int(text_config.max_position_embeddings),
    )


def load_causal_lm(
    path: Path, device: torch.device, dtype: torch.dtype = torch.float32, checkpointing: bool = False
) -> PreTrainedModel:
    """Load the causal LM (or vision-language model) in `path` with base weights in `dtype`, frozen and in
    eval mode; SDPA attention, or FlashAttention 2 on CUDA where `flash_attn` is installed (both keep a
    packed row's datums apart, see `batch.py`).

    Eval mode keeps every pass deterministic (no dropout), so a forward-only pass returns exactly the
    logprobs a training pass on the same weights would. `checkpointing` recomputes each decoder layer's
    activations in backward instead of keeping them.
    """
    attention = attention_implementation(device, dtype)
    logger.info("loading base model %s on %s (%s, %s attention)", path, device, dtype, attention)
    model = load_frozen(path, device, dtype, attention)
    if checkpointing:
        enable_checkpointing(model)
    return model


def attention_implementation(device: torch.device, dtype: torch.dtype) -> str:
    """"flash_attention_2" (varlen kernels for packed rows) on CUDA in 16-bit when flash_attn is
    installed, else "sdpa" (packed rows get a block-diagonal causal mask)."""
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "sdpa"


def enable_checkpointing(model: PreTrainedModel) -> None:
    """Non-reentrant activation checkpointing of every decoder layer, in eval mode.

    transformers checkpoints a layer only while that layer's `training` flag is set; setting the flag on
    the layer objects alone (not their children) turns checkpointing on and leaves dropout and every
    other train-mode behaviour off."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module.training = True
