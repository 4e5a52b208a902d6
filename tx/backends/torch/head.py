"""The unembedding's logits for the trainer's chunked head, lean when it is a plain PEFT LoRA `Linear`.

PEFT's LoRA `Linear` makes the base logits (N, V), then the adapter's B(A(x)) as another (N, V), multiplies
that by the scaling (a third pass over N x V) and adds the two (a fourth); backward repeats the scaling pass.
`lean_head` takes the module's own weights instead and computes

    logits = base(x) + ((x @ A^T) * scaling) @ B^T

with the scaling on the rank side ((N, r), not (N, V)) and the add inside the second matmul (`addmm_` into the
base logits): the same sum up to float rounding, with two fewer passes over the logits each way.

It is taken only where PEFT's forward would be exactly that sum: one active adapter, vanilla LoRA (no DoRA or
other variant), no dropout, unmerged, adapters enabled, plain `Linear` base and LoRA factors without bias on the
factors, no hooks or patched `forward` on the module, no sharded (DTensor) weights. Anything else calls the
module (`lean_head` returns it), so the result is PEFT's own. docs/operations.md#the-training-steps-overhead
holds the figures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from peft.tuners.lora.layer import Linear as LoraLinear

Head = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LeanHead:
    """One LoRA adapter's unembedding, computed from `layer`'s weights (module docstring)."""

    layer: LoraLinear
    base: torch.nn.Linear
    lora_a: torch.nn.Linear
    lora_b: torch.nn.Linear
    scaling: float

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        base = torch.nn.functional.linear(hidden, self.base.weight, self.base.bias)
        dtype = self.lora_a.weight.dtype
        low = torch.nn.functional.linear(self.layer._cast_input_dtype(hidden, dtype), self.lora_a.weight)
        low = low * self.scaling  # (N, r): the scaling where it is cheap
        # PEFT adds the adapter's output (in its dtype) to the base's, then casts back to the base's dtype
        logits = base.to(dtype).flatten(0, -2)
        logits = logits.addmm_(low.flatten(0, -2), self.lora_b.weight.t())
        return logits.view(base.shape).to(base.dtype)


def lean_head(unembedding: torch.nn.Module) -> Head:
    """A `LeanHead` for `unembedding` when its forward is a single plain LoRA (module docstring), else itself."""
    lean = plain_lora(unembedding)
    return unembedding if lean is None else lean


def softcapped(head: Head, logit_cap: float | None) -> Head:
    """`head` as the logits of a model that softcaps them at `logit_cap` (None: `head` itself; `logit_cap.py`)."""
    return head if logit_cap is None else Softcapped(head, logit_cap)


@dataclass(frozen=True)
class Softcapped:
    """The logits of a model that softcaps its head's output: cap * tanh(head(x) / cap), in float32. Its gradient
    runs through autograd (`head_grad.py` takes plain heads only)."""

    head: Head
    cap: float

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(hidden).float() / self.cap) * self.cap


def plain_lora(module: torch.nn.Module) -> LeanHead | None:
    """`module`'s one active adapter as a `LeanHead` when PEFT's forward is exactly base + scaled B(A(x)) (the
    module docstring's conditions), else None. The body's LoRA layers take it too (`lean_body.py`)."""
    if not isinstance(module, LoraLinear) or _hooked(module):
        return None
    active = [name for name in module.active_adapters if name in module.lora_A]
    return plain_adapter(module, active[0]) if len(active) == 1 else None


def plain_adapter(layer: LoraLinear, name: str) -> LeanHead | None:
    """Adapter `name` of `layer` as a `LeanHead` when it is a plain LoRA on a plain `Linear` (module docstring;
    the layer's own hooks are the caller's to check), else None."""
    if layer.disable_adapters or layer.merged or layer.fan_in_fan_out or name in layer.lora_variant:
        return None
    if name not in layer.lora_A:
        return None
    base, lora_a, lora_b = layer.base_layer, layer.lora_A[name], layer.lora_B[name]
    if not (type(layer.lora_dropout[name]) is torch.nn.Identity and plain_linear(base)
            and plain_linear(lora_a) and plain_linear(lora_b) and lora_a.bias is None and lora_b.bias is None):
        return None
    assert isinstance(base, torch.nn.Linear) and isinstance(lora_a, torch.nn.Linear)
    assert isinstance(lora_b, torch.nn.Linear)
    return LeanHead(layer, base, lora_a, lora_b, float(layer.scaling[name]))


def rank_side(factor: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """rows @ factor^T for a (r, k) `factor` of small rank r, as (factor @ rows^T)^T (a view of an (r, tokens)
    product): with r columns out, MKL's matmul runs 2-7x slower than with r rows out (a (512, 128) by (128, 8)
    product: 73 against 20 us on this box's CPU). `head_grad.py` computes the head's LoRA with it."""
    return torch.mm(factor, rows.t()).t()


def plain_linear(module: torch.nn.Module) -> bool:
    """A `torch.nn.Linear` itself (not a subclass: quantized layers), unhooked, with ordinary weights (the head's
    gradient by hand, `head_grad.py`, takes such a head too)."""
    if type(module) is not torch.nn.Linear or _hooked(module):
        return False
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)  # loaded where it is used
    return dtensor is None or not any(isinstance(p, dtensor) for p in (module.weight, module.bias) if p is not None)


def _hooked(module: torch.nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module))
