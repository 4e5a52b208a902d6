"""Tiny random Qwen3 text models, written to a directory like a hub snapshot.

Tests and benchmarks here cannot download a model, so they build one: a `Qwen3ForCausalLM` with random,
seeded weights plus the synthetic tokenizer of `tx.models.tokenizer`. The presets follow
docs/tiny-models.md#the-presets: head_dim 32 or more (vLLM's CPU attention needs it) and, for the 64-wide model,
`initializer_range=0.1` so that LoRA can actually lower the NLL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from tx.models.tiny_files import special_ids, write_model, write_tokenizer

if TYPE_CHECKING:
    from transformers import Qwen3Config


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


def qwen3_config(preset: TinyPreset, ids: dict[str, int]) -> Qwen3Config:
    """The model config for `preset`, with Qwen3's special-token conventions (bos = eos-of-text id)."""
    from transformers import Qwen3Config

    special = special_ids(ids)
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
        bos_token_id=special["bos_token_id"],
        eos_token_id=special["eos_token_id"],
        pad_token_id=special["pad_token_id"],
        dtype="float32",
        architectures=["Qwen3ForCausalLM"],
    )


def write_tiny_text_model(directory: Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write a random Qwen3 model of shape `PRESETS[preset]` plus its tokenizer into `directory`.

    Writes config.json, model.safetensors, generation_config.json and the tokenizer files; the same
    (preset, seed) gives the same weights. The global torch RNG is left untouched. Returns `directory`.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset {preset!r}; the Qwen3 presets are {sorted(PRESETS)}")
    directory = Path(directory)
    ids = write_tokenizer(directory)
    return write_model(directory, qwen3_config(PRESETS[preset], ids), ids, seed, name=preset)
