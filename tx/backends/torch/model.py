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

from tx.models.auto import load_pretrained
from tx.types import BaseModelInfo, UserError

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> torch.device:
    """"auto" -> cuda when available, else cpu; anything else is passed to torch as given."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


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


def load_causal_lm(path: Path, device: torch.device) -> PreTrainedModel:
    """Load the causal LM (or vision-language model) in `path` in float32 with SDPA attention, frozen and in
    eval mode.

    Eval mode keeps every pass deterministic (no dropout), so a forward-only pass returns
    exactly the logprobs a training pass on the same weights would.
    """
    logger.info("loading base model %s on %s", path, device)
    model = load_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def check_tokens(tokens: list[int], info: BaseModelInfo, index: int) -> None:
    """UserError unless every token id is in the vocabulary and the sequence fits the context."""
    if not tokens:
        raise UserError(f"datum {index}: model_input is empty")
    if len(tokens) > info.max_context_length:
        raise UserError(
            f"datum {index}: {len(tokens)} tokens exceed the maximum context length "
            f"{info.max_context_length} of {info.name}"
        )
    low, high = min(tokens), max(tokens)
    if low < 0 or high >= info.vocab_size:
        bad = low if low < 0 else high
        raise UserError(
            f"datum {index}: token id {bad} is outside the vocabulary [0, {info.vocab_size}) of {info.name}"
        )
