"""A lean decode step for dense Qwen3 models: transformers' forward for one new token per row, without its
per-module Python.

On the tiny Qwen3 transformers' decode step spends most of its time in Python around the math: the PEFT wrapper,
the output-capturing and config decorators, `create_causal_mask`, ~15 `nn.Module` calls per layer and PEFT's
per-layer adapter checks (`scripts/bench/decode_step.py`). `Plan` resolves a served model's tensors once (per
model, LoRA layers and active adapter: `Weights.lean_plan`) and `Plan.step` runs the same ops in the same order
on them: the embedding; per layer RMSNorm, the projections (`F.linear`, plus the active LoRA adapter's
`B(A(x)) * scaling` as `lean_lora.lean_forward` computes it), q/k norms, the rotary embedding, the cache update,
the attention function the model is configured with, the MLP; the final norm and the head on the last position.
A cast to the dtype a tensor already has returns that tensor, so it is skipped. The 4D mask is what
transformers' sdpa mask gives a one-token query: none when no row has padding, else each row's padding as a
boolean [B, 1, 1, kv]. Bitwise the same logits: tests/unit/engines/test_embedded_lean_decode.py.

It applies only where that is proven (`supports`): `Qwen3ForCausalLM` (optionally under PEFT) in eval mode with
full attention on every layer, an SDPA attention function, plain or LoRA `Linear` projections (a LoRA layer
with one plain adapter active, or adapters disabled), a plain embedding, no hooks but the adapter mixer's, and
one adapter for every row (a mixed batch needs PEFT's `adapter_names`). Any other model or batch, and rows with
image rope offsets, take transformers' forward (`DecodeBatch.step`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional

from tx.inference.engines.embedded import lean_lora

_SDPA = ("sdpa", "tx_gqa_sdpa")


def causal_lm(model: nn.Module) -> Any:
    """The transformers model under a PEFT wrapper (or `model` itself); Any: its submodules are read by name."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def supports(model: nn.Module) -> bool:
    """Whether `decode_step` gives `model`'s own logits (see the module's docstring)."""
    from peft.tuners.lora import layer as lora
    from transformers.activations import SiLUActivation
    from transformers.models.qwen3 import modeling_qwen3 as qwen3

    inner = causal_lm(model)
    if type(inner) is not qwen3.Qwen3ForCausalLM or inner.training:
        return False
    config: Any = inner.config
    if config._attn_implementation not in _SDPA or any(t != "full_attention" for t in config.layer_types or ()):
        return False
    body = inner.model
    if not _plain_linear(inner.lm_head, lora) or type(body.embed_tokens) is not nn.Embedding:
        return False
    if type(body.norm) is not qwen3.Qwen3RMSNorm or type(body.rotary_emb) is not qwen3.Qwen3RotaryEmbedding:
        return False
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return False
    for layer in inner.model.layers[: config.num_hidden_layers]:
        attn, mlp = layer.self_attn, layer.mlp
        if type(layer) is not qwen3.Qwen3DecoderLayer or type(attn) is not qwen3.Qwen3Attention:
            return False
        if type(mlp) is not qwen3.Qwen3MLP or type(mlp.act_fn) is not SiLUActivation:
            return False
        norms = (layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm)
        if any(type(norm) is not qwen3.Qwen3RMSNorm for norm in norms) or attn.sliding_window is not None:
            return False
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if not all(_plain_linear(m, lora) for m in linears):
            return False
    return all(not (m._forward_hooks or m._forward_pre_hooks) or isinstance(m, lora.LoraLayer)
               for m in inner.modules())


def _plain_linear(module: nn.Module, lora: Any) -> bool:
    return type(module) is nn.Linear or type(module) is lora.Linear and type(module.base_layer) is nn.Linear


def padding_mask(mask: torch.Tensor) -> torch.Tensor | None:
    """transformers' sdpa mask for a one-token query over a cache whose 2D mask is `mask` [B, kv] (the query's
    own column included): None when nothing is padded, else the rows' padding as bool [B, 1, 1, kv]."""
    if bool(mask.all()):
        return None
    return mask.bool()[:, None, None, :]


@dataclass(frozen=True)
class _Linear:
    """A projection's tensors: the base `F.linear`, and the one LoRA adapter it applies (if any)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    lora: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None, float] | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`lean_lora.lean_forward`'s ops (PEFT's): base(x) + B(A(x)) * scaling, cast back to base(x)'s dtype."""
        result = functional.linear(x, self.weight, self.bias)
        if self.lora is None:
            return result
        a_weight, a_bias, b_weight, b_bias, scaling = self.lora
        result_dtype = result.dtype
        if x.dtype != a_weight.dtype:
            x = x.to(dtype=a_weight.dtype)
        hidden = functional.linear(x, a_weight, a_bias)
        result = result + functional.linear(hidden, b_weight, b_bias) * scaling
        return result if result.dtype == result_dtype else result.to(result_dtype)


@dataclass(frozen=True)
class _Norm:
    weight: torch.Tensor
    eps: float

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Qwen3RMSNorm.forward's ops (a cast to the dtype a tensor has is that tensor: skipped)."""
        input_dtype = hidden.dtype
        if input_dtype != torch.float32:
            hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.eps)
        return self.weight * (hidden if input_dtype == torch.float32 else hidden.to(input_dtype))


@dataclass(frozen=True)
class _Layer:
    attn: nn.Module  # the attention function's `module` argument
    head_dim: int
    input_norm: _Norm
    post_norm: _Norm
    q_norm: _Norm
    k_norm: _Norm
    q: _Linear
    k: _Linear
    v: _Linear
    o: _Linear
    gate: _Linear
    up: _Linear
    down: _Linear


@dataclass(frozen=True)
class Plan:
    """One served model's decode step, its tensors resolved once (for one active adapter, or none)."""

    embed: nn.Embedding
    rotary: nn.Module
    attention: Callable[..., tuple[torch.Tensor, Any]]
    layers: tuple[_Layer, ...]
    norm: _Norm
    head: _Linear

    def step(self, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
             cache: Any) -> torch.Tensor:
        """The next-token logits [B, vocab] for `input_ids` [B, 1] at `position_ids` [B, 1], appending to `cache`
        (`mask` [B, kv]: the 2D attention mask including the new column)."""
        embed = self.embed
        hidden = functional.embedding(input_ids, embed.weight, embed.padding_idx, embed.max_norm, embed.norm_type,
                                      embed.scale_grad_by_freq, embed.sparse)
        attention_mask = padding_mask(mask)
        cos, sin = self.rotary(hidden, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        for index, layer in enumerate(self.layers):
            residual = hidden
            hidden = residual + self._attention(layer, index, layer.input_norm(hidden), cos, sin, cache,
                                                attention_mask)
            residual = hidden
            hidden = layer.post_norm(hidden)
            hidden = residual + layer.down(functional.silu(layer.gate(hidden)) * layer.up(hidden))
        hidden = self.norm(hidden)
        return self.head(hidden[:, -1:, :])[:, -1]

    def _attention(self, layer: _Layer, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   cache: Any, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Qwen3Attention.forward's ops for one token per row."""
        attn = layer.attn
        input_shape = hidden.shape[:-1]
        hidden_shape = (*input_shape, -1, layer.head_dim)
        query = layer.q_norm(layer.q(hidden).view(hidden_shape)).transpose(1, 2)
        key = layer.k_norm(layer.k(hidden).view(hidden_shape)).transpose(1, 2)
        value = layer.v(hidden).view(hidden_shape).transpose(1, 2)
        query = (query * cos) + (_rotate_half(query) * sin)
        key = (key * cos) + (_rotate_half(key) * sin)
        key, value = cache.update(key, value, index)
        out, _ = self.attention(attn, query, key, value, attention_mask, dropout=0.0, scaling=attn.scaling,
                                sliding_window=None)
        return layer.o(out.reshape(*input_shape, -1).contiguous())


def plan(model: nn.Module) -> Plan | None:
    """`model`'s decode step with its tensors resolved now (`supports(model)` must hold), or None when a LoRA layer
    would take PEFT's own forward (`lean_lora`: a variant, dropout, several active adapters, ...)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    inner = causal_lm(model)
    body, config = inner.model, inner.config
    layers = []
    for index, layer in enumerate(body.layers[: config.num_hidden_layers]):
        attn, mlp = layer.self_attn, layer.mlp
        if attn.layer_idx != index:
            return None
        linears = [_resolve(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                          mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
        if any(linear is None for linear in linears):
            return None
        q, k, v, o, gate, up, down = cast("list[_Linear]", linears)
        layers.append(_Layer(attn, attn.head_dim, _norm(layer.input_layernorm), _norm(layer.post_attention_layernorm),
                             _norm(attn.q_norm), _norm(attn.k_norm), q, k, v, o, gate, up, down))
    head = _resolve(inner.lm_head)
    if head is None:
        return None
    return Plan(body.embed_tokens, body.rotary_emb, ALL_ATTENTION_FUNCTIONS[config._attn_implementation],
                tuple(layers), _norm(body.norm), head)


def _resolve(module: Any) -> _Linear | None:
    if type(module) is nn.Linear:
        return _Linear(module.weight, module.bias)
    name = lean_lora.sole_adapter(module)
    base = module.base_layer
    if name is None:
        return _Linear(base.weight, base.bias) if module.disable_adapters and not module.merged_adapters else None
    if not getattr(module, "cast_input_dtype_enabled", True):
        return None
    lora_a, lora_b = module.lora_A[name], module.lora_B[name]
    return _Linear(base.weight, base.bias, (lora_a.weight, lora_a.bias, lora_b.weight, lora_b.bias,
                                            module.scaling[name]))


def _norm(norm: Any) -> _Norm:
    return _Norm(norm.weight, norm.variance_epsilon)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
