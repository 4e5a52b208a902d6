"""The body's LoRA `Linear` layers as one autograd node each during a training pass, where PEFT's forward makes five.

PEFT's LoRA `Linear.forward` runs the base layer, A, B, the scaling (a pass over the (tokens, out) output) and
the sum with the base (another), each a node of the autograd graph, and its backward runs the scaling again and
sums the input's two gradients. On a small model those ops' dispatch and autograd bookkeeping, more than their
arithmetic, is much of the body's time. `lean_linears` gives each plain LoRA layer of the body (`head.plain_lora`:
one active adapter, vanilla LoRA, no dropout, plain `Linear`s, no hooks, no sharded weights) a forward that is
ONE autograd node, `_LoraLinear`:

    forward:   low = s (x A^T)  (tokens, r);   y = x W^T (+ b) + low B^T   (the sum inside `addmm_`)
    backward:  d low = s (g B);   d x = g W + (d low) A;   d A = (d low)^T x;   d B = (low^T g)^T

each skinny product (r columns out) computed as its transpose (`head.rank_side`), the layout MKL runs fast, as the
head does (`head_grad.py`). The same sums as PEFT's up to float32 rounding: tests/unit/backends/test_lean_body.py
holds logprobs, losses and gradients to PEFT's. It is taken only in float32 with a frozen base and no extra
arguments (`lean_output`); any other call, layer or dtype (a bfloat16 base on a GPU) runs PEFT's own forward.
Several runs in one pass (`segments.py`) run each block through the same node, so a run's rows are computed
there as alone. The forwards are set on the instances for the pass and removed after; the pass holds them
through its backward too (gradient checkpointing recomputes the forward there).
docs/operations.md#the-training-steps-overhead has the figures.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from peft.tuners.lora.layer import Linear as LoraLinear

from tx.backends.torch.head import LeanHead, plain_lora, rank_side


@contextmanager
def lean_linears(model: torch.nn.Module, skip: torch.nn.Module | None = None) -> Iterator[int]:
    """While open, every plain LoRA `Linear` of `model` outside `skip` runs lean (module docstring); yields how
    many do."""
    skipped = {id(m) for m in skip.modules()} if skip is not None else set()
    patched = []
    for module in model.modules():
        if isinstance(module, LoraLinear) and id(module) not in skipped:
            lean = plain_lora(module)
            if lean is not None and _may_take(lean):  # else PEFT's forward, with no wrapper in between
                setattr(module, "forward", functools.partial(_forward, lean))  # the instance's wins
                patched.append(module)
    try:
        yield len(patched)
    finally:
        for module in patched:
            delattr(module, "forward")


def _may_take(lean: LeanHead) -> bool:
    """Whether `lean_output` can take `lean`'s layer on some input: float32 weights and a frozen base (a bfloat16
    base on a GPU never can, so its layers are left as they are)."""
    base = lean.base
    weights = (base.weight, lean.lora_a.weight, lean.lora_b.weight) + (() if base.bias is None else (base.bias,))
    return all(w.dtype == torch.float32 for w in weights) and not any(p.requires_grad for p in base.parameters())


def lean_output(lean: LeanHead, x: torch.Tensor) -> torch.Tensor | None:
    """`lean`'s layer on `x` as one autograd node, or None where it does not apply (float32 only, a frozen base)."""
    weight, bias = lean.base.weight, lean.base.bias
    lora_a, lora_b = lean.lora_a.weight, lean.lora_b.weight
    tensors = (x, weight, lora_a, lora_b) if bias is None else (x, weight, bias, lora_a, lora_b)
    if any(t.dtype != torch.float32 or t.device != x.device for t in tensors):
        return None
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        return None  # a trained base: PEFT's
    out = _LoraLinear.apply(x, weight, bias, lora_a, lora_b, lean.scaling)
    assert isinstance(out, torch.Tensor)
    return out


def _forward(lean: LeanHead, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    out = None if args or kwargs else lean_output(lean, x)
    return type(lean.layer).forward(lean.layer, x, *args, **kwargs) if out is None else out  # else PEFT's


class _LoraLinear(torch.autograd.Function):
    """y = x W^T + b + s (x A^T) B^T as one autograd node (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        low = rank_side(lora_a, flat).mul_(scaling)  # (tokens, r)
        out = torch.nn.functional.linear(flat, weight, bias).addmm_(low, lora_b.t())
        ctx.save_for_backward(flat, weight, lora_a, lora_b, low)
        ctx.scaling, ctx.shape = scaling, x.shape
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        flat, weight, lora_a, lora_b, low = ctx.saved_tensors
        grad = grads[0].reshape(-1, grads[0].shape[-1])
        need_x, _, _, need_a, need_b, _ = ctx.needs_input_grad
        grad_x = grad_a = grad_b = None
        if need_x or need_a:
            dlow = rank_side(lora_b.t(), grad).mul_(ctx.scaling)  # s (g B)
            if need_x:
                grad_x = torch.mm(grad, weight).addmm_(dlow, lora_a).view(ctx.shape)
            if need_a:
                grad_a = torch.mm(dlow.t(), flat)
        if need_b:
            grad_b = torch.mm(low.t(), grad).t()  # (low^T g)^T: the fast layout
        return grad_x, None, None, grad_a, grad_b, None
