"""Base models: where they live, what clients are told about them, and loading each one once.

A served base model is a local Hugging Face model directory (config.json + weights). Its
`BaseModelInfo` comes from the config alone, so listing models never loads weights; the weights
are loaded on the first run created on that model and then shared by every run on it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoConfig, PreTrainedModel

from tx.config.names import AttnImplementation
from tx.models.attention import choose_attention
from tx.models.auto import load_frozen
from tx.types import BaseModelInfo, UserError

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
    path: Path, device: torch.device, dtype: torch.dtype = torch.float32, checkpointing: bool = False,
    attention: AttnImplementation | None = None, runs_on: torch.device | None = None,
) -> PreTrainedModel:
    """Load the causal LM (or vision-language model) in `path` with base weights in `dtype`, frozen and in
    eval mode, with `attention` or else the best attention its family supports on `runs_on` (default:
    `device`; `tx/models/attention.py`).

    Eval mode keeps every pass deterministic (no dropout), so a forward-only pass returns exactly the
    logprobs a training pass on the same weights would. `checkpointing` recomputes each decoder layer's
    activations in backward instead of keeping them.
    """
    half = dtype in (torch.bfloat16, torch.float16)
    chosen = choose_attention(path, (runs_on or device).type, half, attention)
    logger.info("loading base model %s on %s (%s, %s attention)", path, device, dtype, chosen)
    try:
        model = load_frozen(path, device, dtype, chosen)
    except (ValueError, ImportError) as exc:
        if attention is None:  # tx's own choice failed: not the user's doing
            raise
        raise UserError(f"cannot load {path} with the forced {chosen} attention: {exc}") from exc
    if checkpointing:
        enable_checkpointing(model)
    return model


@contextmanager
def checkpointing_off(model: PreTrainedModel) -> Iterator[None]:
    """Run the block with every decoder layer keeping its activations (no recompute in backward), on a model
    `enable_checkpointing` set up."""
    layers = _checkpointing_layers(model)
    for layer in layers:
        layer.training = False
    try:
        yield
    finally:
        for layer in layers:
            layer.training = True


def _checkpointing_layers(model: PreTrainedModel) -> list[torch.nn.Module]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]


def enable_checkpointing(model: PreTrainedModel) -> None:
    """Non-reentrant activation checkpointing of every decoder layer, in eval mode.

    transformers checkpoints a layer only while that layer's `training` flag is set; setting the flag on
    the layer objects alone (not their children) turns checkpointing on and leaves dropout and every
    other train-mode behaviour off. transformers 5.23 renamed `gradient_checkpointing_enable` (the old name
    warns); 5.19, the oldest tx takes, has only the old one."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in _checkpointing_layers(model):
        layer.training = True


def training_flops_per_token(model: PreTrainedModel) -> float:
    """About how many floating-point operations a training pass spends per token: forward and backward, 6 per
    weight that touches it (every weight but the input embeddings' row lookups, the output head's counted
    once more where it shares the input embeddings'). An over-estimate for MoE (every expert counted)."""
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    skipped = {id(p) for p in embeddings.parameters()} if embeddings is not None else set()
    weights = sum(p.numel() for p in model.parameters() if id(p) not in skipped)
    if head is not None and any(id(p) in skipped for p in head.parameters()):
        weights += sum(p.numel() for p in head.parameters())
    return 6.0 * weights
