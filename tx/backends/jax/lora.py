"""LoRA adapters of the JAX backend: which modules, their init, and their names in PEFT files.

Same choices as the torch backend (`tx/backends/torch/lora.py`): alpha 32, the attention, MLP and unembedding
groups chosen by the run's `LoraConfig`, A drawn like PEFT's default (uniform in ±1/sqrt(fan_in)) from the
run's seed and B zero, so a fresh adapter changes nothing. Inside the backend an adapter is a dict
module path -> (A, B); on disk and on the wire its tensors are named as PEFT names them, so either backend
reads the other's files.
"""

from __future__ import annotations

import secrets

import numpy as np

from tx.backends.jax.spec import ModelSpec
from tx.backends.torch.lora import LORA_ALPHA
from tx.types import LoraConfig

PEFT_PREFIX = "base_model.model."
ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
"""What a dense Qwen3 / Llama layer's attention and MLP hold: the modules this backend adapts (the torch
backend reads the same from the model's structure, `tx/models/lora_targets.py`, so the files agree)."""


def module_shapes(spec: ModelSpec, lora: LoraConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of every module the run adapts, by module path, in a stable order."""
    q_out, kv_out = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    hidden, inter = spec.hidden_size, spec.intermediate_size
    sizes = {"q_proj": (q_out, hidden), "k_proj": (kv_out, hidden), "v_proj": (kv_out, hidden),
             "o_proj": (hidden, q_out), "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
             "down_proj": (hidden, inter)}
    shapes = {}
    for layer in range(spec.num_layers):
        for names, group in ((ATTN_MODULES, "self_attn"), (MLP_MODULES, "mlp")):
            if (group == "self_attn" and lora.train_attn) or (group == "mlp" and lora.train_mlp):
                for name in names:
                    shapes[f"model.layers.{layer}.{group}.{name}"] = sizes[name]
    if lora.train_unembed:
        shapes["lm_head"] = (spec.vocab_size, hidden)
    return shapes


def scale(lora: LoraConfig) -> float:
    return LORA_ALPHA / lora.rank


def init_adapter(spec: ModelSpec, lora: LoraConfig) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A fresh adapter: A uniform in ±1/sqrt(in) from `lora.seed` (a random seed when None), B zero."""
    rng = np.random.default_rng(secrets.randbits(63) if lora.seed is None else lora.seed)
    adapter = {}
    for path, (out_dim, in_dim) in module_shapes(spec, lora).items():
        bound = 1.0 / np.sqrt(in_dim)
        a = rng.uniform(-bound, bound, size=(lora.rank, in_dim)).astype(np.float32)
        adapter[path] = (a, np.zeros((out_dim, lora.rank), np.float32))
    return adapter


def peft_names(path: str) -> tuple[str, str]:
    """The PEFT file names of module `path`'s A and B."""
    return f"{PEFT_PREFIX}{path}.lora_A.weight", f"{PEFT_PREFIX}{path}.lora_B.weight"


def to_peft(adapter: dict) -> dict:
    """{PEFT name: array} of an adapter, sorted by name (the order the torch optimizer numbers them in)."""
    flat = {}
    for path, (a, b) in adapter.items():
        name_a, name_b = peft_names(path)
        flat[name_a], flat[name_b] = a, b
    return dict(sorted(flat.items()))


def from_peft(flat: dict, paths: list[str]) -> dict:
    """The adapter over module `paths` from {PEFT name: array}; KeyError names a missing tensor."""
    return {path: (flat[peft_names(path)[0]], flat[peft_names(path)[1]]) for path in paths}
