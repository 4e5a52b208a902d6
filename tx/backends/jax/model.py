"""Qwen3 and Llama 3 forward passes in plain JAX, over dicts of arrays named as in the HF checkpoint.

`base` maps HF weight names (`model.layers.0.self_attn.q_proj.weight`, ...) to float32 arrays; linear weights
keep HF's (out, in) layout so loading is a rename-free copy. `lora` maps a module path
(`model.layers.0.self_attn.q_proj`) to its (A, B) pair, A (rank, in) and B (out, rank) as in PEFT, and a
LoRA module computes `x W^T + scale * (x A^T) B^T`. Sequences are right-padded, so the causal mask alone
keeps every real position away from padding.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from tx.backends.jax.spec import ModelSpec

logger = logging.getLogger(__name__)

Params = dict[str, jax.Array]
Lora = dict[str, tuple[jax.Array, jax.Array]]


def load_weights(path: Path, spec: ModelSpec) -> dict[str, np.ndarray]:
    """The base weights in `path`'s safetensors files as float32 numpy arrays (a tied lm_head is left out)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no *.safetensors weights")
    weights = {}
    for file in files:
        with safe_open(str(file), framework="flax") as handle:
            for name in handle.keys():
                if "rotary_emb" not in name:
                    weights[name] = np.asarray(handle.get_tensor(name).astype(jnp.float32))
    if spec.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    logger.info("loaded %d tensors from %s", len(weights), path)
    return weights


def rope_frequencies(spec: ModelSpec) -> np.ndarray:
    """Inverse rotary frequencies (head_dim / 2,), with Llama 3's long-context scaling when configured."""
    dim = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if not spec.rope_scaling:
        return inv_freq.astype(np.float32)
    s = dict(spec.rope_scaling)
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / s["low_freq_factor"], old_len / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s["factor"], inv_freq)
    smooth = (old_len / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    return weight * (x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps))


def _linear(x: jax.Array, base: Params, lora: Lora, scale: jax.Array, path: str) -> jax.Array:
    y = x @ base[f"{path}.weight"].T
    if f"{path}.bias" in base:
        y = y + base[f"{path}.bias"]
    if path in lora:
        a, b = lora[path]
        y = y + scale * ((x @ a.T) @ b.T)
    return y


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _attention(spec: ModelSpec, x: jax.Array, base: Params, lora: Lora, scale: jax.Array, prefix: str,
               cos: jax.Array, sin: jax.Array) -> jax.Array:
    batch, length, _ = x.shape
    heads = {}
    for name, count in (("q", spec.num_heads), ("k", spec.num_kv_heads), ("v", spec.num_kv_heads)):
        heads[name] = _linear(x, base, lora, scale, f"{prefix}.{name}_proj").reshape(
            batch, length, count, spec.head_dim
        )
    q, k, v = heads["q"], heads["k"], heads["v"]
    if spec.family == "qwen3":
        q = _rms_norm(q, base[f"{prefix}.q_norm.weight"], spec.rms_norm_eps)
        k = _rms_norm(k, base[f"{prefix}.k_norm.weight"], spec.rms_norm_eps)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return _linear(out.reshape(batch, length, -1), base, lora, scale, f"{prefix}.o_proj")


def _mlp(x: jax.Array, base: Params, lora: Lora, scale: jax.Array, prefix: str) -> jax.Array:
    gate = jax.nn.silu(_linear(x, base, lora, scale, f"{prefix}.gate_proj"))
    up = _linear(x, base, lora, scale, f"{prefix}.up_proj")
    return _linear(gate * up, base, lora, scale, f"{prefix}.down_proj")


def logits(spec: ModelSpec, base: Params, lora: Lora, scale: jax.Array, input_ids: jax.Array) -> jax.Array:
    """(B, T, V) float32 logits of right-padded (B, T) token ids, with the LoRA `lora` applied."""
    eps = spec.rms_norm_eps
    h = base["model.embed_tokens.weight"][input_ids]
    angles = jnp.arange(input_ids.shape[1], dtype=jnp.float32)[:, None] * rope_frequencies(spec)[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)[None, :, None, :]  # (1, T, 1, head_dim)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    for i in range(spec.num_layers):
        prefix = f"model.layers.{i}"
        x = _rms_norm(h, base[f"{prefix}.input_layernorm.weight"], eps)
        h = h + _attention(spec, x, base, lora, scale, f"{prefix}.self_attn", cos, sin)
        x = _rms_norm(h, base[f"{prefix}.post_attention_layernorm.weight"], eps)
        h = h + _mlp(x, base, lora, scale, f"{prefix}.mlp")
    h = _rms_norm(h, base["model.norm.weight"], eps)
    unembed = base.get("lm_head.weight", base["model.embed_tokens.weight"])
    out = h @ unembed.T
    if "lm_head" in lora:
        a, b = lora["lm_head"]
        out = out + scale * ((h @ a.T) @ b.T)
    return out


def target_logprobs(logits_: jax.Array, targets: jax.Array) -> jax.Array:
    """log_softmax(logits)[target] for (B, T, V) logits and (B, T, K) targets -> (B, T, K)."""
    shifted = logits_ - jax.lax.stop_gradient(logits_.max(axis=-1, keepdims=True))
    log_norm = jnp.log(jnp.exp(shifted).sum(axis=-1, keepdims=True))
    return jnp.take_along_axis(shifted, targets, axis=-1) - log_norm
