"""A leaner forward for PEFT's LoRA `Linear` layers while one adapter serves every row of a batch.

PEFT's `lora.Linear.forward` checks its arguments, builds kwargs dicts, loops over the active adapters and calls
the dropout, `lora_A` and `lora_B` modules: on the tiny Qwen3 that Python costs more than the layer's matmuls
(14 LoRA layers per decode step; `scripts/bench/decode_step.py`). `lean_forward` computes the same
`base(x) + lora_B(lora_A(dropout(x))) * scaling` with the same ops in the same order (so bitwise the same
result), calling `F.linear` on the adapter's weights directly. Any other case takes PEFT's own forward: extra
arguments (a mixed-adapter batch's `adapter_names`, `mixing.py`), adapters disabled or merged, several active
adapters, a LoRA variant (DoRA, ...), a dropout that is not the identity.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional

ORIGINAL_FORWARD = "_tx_peft_forward"


def install(layer: torch.nn.Module) -> None:
    """Give `layer` (a PEFT `lora.Linear`) the lean forward; PEFT's own stays as its fallback."""
    if getattr(layer, ORIGINAL_FORWARD, None) is None:
        object.__setattr__(layer, ORIGINAL_FORWARD, layer.forward)
        object.__setattr__(layer, "forward", lambda x, *args, **kwargs: lean_forward(layer, x, *args, **kwargs))


def lean_forward(layer: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    name = sole_adapter(layer) if not args and not kwargs else None
    if name is None:
        return getattr(layer, ORIGINAL_FORWARD)(x, *args, **kwargs)
    result = layer.base_layer(x)
    result_dtype = result.dtype
    lora_a, lora_b = layer.lora_A[name], layer.lora_B[name]
    if getattr(layer, "cast_input_dtype_enabled", True) and x.dtype != lora_a.weight.dtype:
        x = x.to(dtype=lora_a.weight.dtype)
    hidden = functional.linear(x, lora_a.weight, lora_a.bias)
    result = result + functional.linear(hidden, lora_b.weight, lora_b.bias) * layer.scaling[name]
    return result.to(result_dtype)


def sole_adapter(layer: Any) -> str | None:
    """The one plain LoRA adapter `layer` applies now, or None when PEFT's forward must run."""
    if layer.disable_adapters or layer.merged_adapters:
        return None
    active = layer.active_adapter
    name = active if isinstance(active, str) else active[0] if len(active) == 1 else None
    if name is None or name not in layer.lora_A or name in layer.lora_variant:
        return None
    if type(layer.lora_dropout[name]) is not torch.nn.Identity:
        return None
    if type(layer.lora_A[name]) is not torch.nn.Linear or type(layer.lora_B[name]) is not torch.nn.Linear:
        return None
    return name
