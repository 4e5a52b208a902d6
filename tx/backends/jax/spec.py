"""What the JAX backend needs to know about a served model, read from its HF config (no weights).

Supported: dense Qwen3 (`Qwen3ForCausalLM`) and Llama (`LlamaForCausalLM`, Llama 3's rope scaling included).
Anything else, vision-language models first, is refused when the server starts, naming the torch backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig

ARCHITECTURES = {"Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape; hashable, so jitted functions take it as a static argument."""

    family: str  # "qwen3" (q/k norms) or "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: tuple[tuple[str, float], ...]  # Llama 3's (factor, low/high_freq_factor, original length)
    tie_word_embeddings: bool


def read_spec(path: Path) -> ModelSpec:
    """The spec of the model in `path`; ValueError (a startup error) for what this backend cannot train."""
    config = AutoConfig.from_pretrained(path)
    arch = (getattr(config, "architectures", None) or ["?"])[0]
    if arch not in ARCHITECTURES:
        kind = "a vision-language model" if hasattr(config, "vision_config") else "not supported"
        raise ValueError(
            f"{path}: {arch} is {kind} under --backend jax (it trains {', '.join(ARCHITECTURES)}); "
            "serve it with --backend torch"
        )
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "use_sliding_window", False):
        raise ValueError(f"{path}: only SiLU MLPs without sliding-window attention run under --backend jax")
    rope = dict(config.rope_parameters or {})
    rope_type = rope.pop("rope_type", "default")
    theta = float(rope.pop("rope_theta", getattr(config, "rope_theta", 10000.0)))
    if rope_type not in ("default", "llama3"):
        raise ValueError(f"{path}: rope type {rope_type!r} is not supported under --backend jax")
    scaling_keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    scaling = tuple((key, float(rope[key])) for key in scaling_keys) if rope_type == "llama3" else ()
    return ModelSpec(
        family=ARCHITECTURES[arch],
        vocab_size=int(config.vocab_size),
        hidden_size=int(config.hidden_size),
        intermediate_size=int(config.intermediate_size),
        num_layers=int(config.num_hidden_layers),
        num_heads=int(config.num_attention_heads),
        num_kv_heads=int(config.num_key_value_heads),
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads),
        rms_norm_eps=float(config.rms_norm_eps),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
    )
