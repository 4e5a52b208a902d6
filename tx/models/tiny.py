"""Tiny random Qwen3 text models, written to a directory like a hub snapshot.

Tests and benchmarks here cannot download a model, so they build one: a `Qwen3ForCausalLM` with random,
seeded weights plus the synthetic tokenizer of `tx.models.tokenizer`. The presets follow
docs/tiny-models.md#the-presets: head_dim 32 or more (vLLM's CPU attention needs it) and, for the 64-wide model,
`initializer_range=0.1` so that LoRA can actually lower the NLL.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from tx.models.tokenizer import ADDED_TOKENS, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, build_tokenizer

if TYPE_CHECKING:
    from transformers import Qwen3Config

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TinyPreset:
    """The shape of one tiny Qwen3 model."""

    hidden_size: int
    """Width of the residual stream."""
    num_hidden_layers: int
    """Number of decoder layers."""
    num_attention_heads: int
    """Query heads per layer."""
    num_key_value_heads: int
    """Key/value heads per layer (grouped-query attention)."""
    head_dim: int
    """Size of one attention head (>= 32 for vLLM on CPU)."""
    intermediate_size: int
    """Width of the MLP."""
    vocab_size: int
    """Rows of the embedding and lm_head; at least the tokenizer's full size."""
    max_position_embeddings: int = 2048
    """Longest sequence the rotary embedding is configured for."""
    initializer_range: float = 0.02
    """Std of the normal init of the weights."""

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim < 32:
            raise ValueError("head_dim must be >= 32 (vLLM's CPU attention needs it)")


PRESETS: Mapping[str, TinyPreset] = MappingProxyType(
    {
        "tiny": TinyPreset(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=128,
            vocab_size=2048,
            initializer_range=0.1,
        ),
        "bench": TinyPreset(
            hidden_size=512,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            intermediate_size=1536,
            vocab_size=8000,
        ),
        # Qwen3's real vocabulary on two tiny layers: the trainer's memory at real vocabulary sizes
        # (scripts/bench/train_memory.py).
        "vocab-h64": TinyPreset(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=192,
            vocab_size=151_936,
        ),
        "vocab-h256": TinyPreset(
            hidden_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            intermediate_size=768,
            vocab_size=151_936,
        ),
    }
)
"""The tiny model shapes by name: "tiny" for tests (~0.4M parameters), "bench" for benchmarks (~21M),
"vocab-h64" / "vocab-h256" with Qwen3's vocabulary (~20M / ~78M, nearly all embedding and unembedding)."""


def token_ids(directory: Path) -> dict[str, int]:
    """Ids of the special and added tokens, read back from the tokenizer.json just written."""
    data = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    return {entry["content"]: entry["id"] for entry in data["added_tokens"]}


def _qwen3_config(preset: TinyPreset, ids: dict[str, int]) -> Qwen3Config:
    """The model config for `preset`, with Qwen3's special-token conventions (bos = eos-of-text id)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=preset.vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_key_value_heads,
        head_dim=preset.head_dim,
        max_position_embeddings=preset.max_position_embeddings,
        initializer_range=preset.initializer_range,
        tie_word_embeddings=False,
        bos_token_id=ids[PAD_TOKEN],
        eos_token_id=ids[EOS_TOKEN],
        pad_token_id=ids[PAD_TOKEN],
        dtype="float32",
        architectures=["Qwen3ForCausalLM"],
    )


def write_tiny_text_model(directory: Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write a random Qwen3 model of shape `PRESETS[preset]` plus its tokenizer into `directory`.

    Writes config.json, model.safetensors, generation_config.json and the tokenizer files; the same
    (preset, seed) gives the same weights. The global torch RNG is left untouched. Returns `directory`.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset {preset!r}; choose one of {[*sorted(PRESETS), 'vlm']}")
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, Qwen3ForCausalLM

    shape = PRESETS[preset]
    directory = Path(directory)
    build_tokenizer(directory)
    ids = token_ids(directory)
    num_tokens = max(ids.values()) + 1
    if num_tokens > shape.vocab_size:
        raise ValueError(f"preset {preset!r} has vocab_size {shape.vocab_size} < tokenizer size {num_tokens}")
    assert set(ids) == set(SPECIAL_TOKENS) | set(ADDED_TOKENS), "tokenizer added tokens changed"
    config = _qwen3_config(shape, ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32)  # pyright: ignore[reportArgumentType]  (transformers hides .to's self)
    generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    config.save_pretrained(str(directory))
    generation_config.save_pretrained(str(directory))
    tensors = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    weights = directory / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors creates it owner-only; a shared HF cache needs it readable
    num_parameters = model.num_parameters()
    logger.info("wrote tiny %r model (seed %d, %d parameters) to %s", preset, seed, num_parameters, directory)
    return directory
