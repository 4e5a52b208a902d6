"""The chunked head of a per-token loss with its gradient by hand: no autograd graph over positions x vocab.

Under autograd (`logprobs.per_token_backward`'s general way) a chunk's head costs, over its (n, V) logits: the
logits, the log-softmax (a second (n, V) tensor), the loss's gradient as a third (zeros, then the targets'
entries), the log-softmax's backward (a fourth), and the matmuls that carry it into the hidden states and the
head's LoRA, one of them (B's gradient) in a layout that runs ~10x slower than its transpose on CPU.

Here, for a head whose logits are `x W^T (+ b) + s (x A^T) B^T` (a `LeanHead`, or a plain `Linear` without
LoRA), in float32, on one (n, V) buffer per chunk: the logits; their row max and the targets' logits; the
softmax P in place; the log-sum-exp from P's row max (P's largest entry is exp(max - lse), at least 1/V: it never
underflows); logp = target logit - lse. Only the loss runs under autograd, on the small (n, K) logprobs: it
gives c = d loss / d logp. The logits' gradient G = sum_k c_k (onehot(t_k) - P) is then made in place of P (one
scaling pass and a scatter of n x K entries, as autograd's log-softmax backward makes it), and carried by
explicit matmuls:

    d x = G W + s (G B) A,    d B += G^T low (as low^T G, (r, V): the layout MKL runs fast),    d A += s (G B)^T x

where low = s x A^T. The same sums as autograd's up to float rounding: tests/unit/backends/test_head_grad.py
holds logprobs, loss and gradients to PEFT's within 1e-5; figures in docs/operations.md#the-training-steps-overhead.
Anything else (another dtype, DoRA, dropout, hooks: whatever `head.lean_head` does not take) returns None and the
caller runs autograd.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tx.backends.torch.head import Head, LeanHead, plain_linear, rank_side

ChunkLoss = Callable[[torch.Tensor, slice], torch.Tensor]


@dataclass(frozen=True)
class _Weights:
    """A head's tensors, detached: the base (W, b) and, with LoRA, A, B and the scaling."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    lora: tuple[torch.Tensor, torch.Tensor, float] | None


def per_token_by_hand(
    hidden: torch.Tensor, unembed: Head, targets: torch.Tensor, chunk: int, chunk_loss: ChunkLoss
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """`logprobs.per_token_backward`'s result, computed by hand (module docstring); None where it does not apply.

    The LoRA factors' gradients accumulate into their `.grad` (as autograd's would)."""
    weights = _weights(unembed, hidden)
    if weights is None:
        return None
    lora = weights.lora
    factors = (unembed.lora_a.weight, unembed.lora_b.weight) if isinstance(unembed, LeanHead) else ()
    wanted = [p.requires_grad for p in factors]
    grad_a = grad_bt = None
    if lora is not None:
        a, b, _ = lora
        grad_a, grad_bt = torch.zeros_like(a), b.new_zeros(b.shape[::-1])  # B's as (r, V)
    x_all = hidden.detach()
    grad = torch.empty_like(x_all) if hidden.requires_grad else torch.zeros_like(x_all)  # zeros: not wanted
    buffer = x_all.new_empty(min(chunk, x_all.shape[0]), weights.weight.shape[0])  # each chunk's logits, reused
    pieces, total = [], x_all.new_zeros(())
    for start in range(0, x_all.shape[0], chunk):
        rows = slice(start, start + chunk)
        logp, loss, grad_x = _chunk(x_all[rows], targets[rows], weights, chunk_loss, rows, buffer,
                                    (grad_a, grad_bt), hidden.requires_grad)
        if grad_x is not None:
            grad[rows] = grad_x
        pieces.append(logp)
        total += loss
    if grad_bt is not None and grad_a is not None:
        for param, value, want in zip(factors, (grad_a, grad_bt.t().contiguous()), wanted, strict=True):
            if want:
                param.grad = value if param.grad is None else param.grad.add_(value)
    return torch.cat(pieces) if len(pieces) > 1 else pieces[0], total, grad


def _chunk(
    x: torch.Tensor,
    targets: torch.Tensor,
    weights: _Weights,
    chunk_loss: ChunkLoss,
    rows: slice,
    buffer: torch.Tensor,
    grads: tuple[torch.Tensor | None, torch.Tensor | None],
    want_x: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One chunk: (logp (n, K), its loss, d loss / d x (n, H) if `want_x`); the LoRA's gradients added to
    `grads`."""
    logits = torch.mm(x, weights.weight.t(), out=buffer[: x.shape[0]])  # (n, V)
    if weights.bias is not None:
        logits += weights.bias
    low = None
    if weights.lora is not None:
        a, b, scaling = weights.lora
        low = rank_side(a, x).mul_(scaling)  # (n, r)
        logits.addmm_(low, b.t())
    peak = logits.amax(-1, keepdim=True)
    picked = logits.gather(1, targets)  # (n, K)
    probs = torch.ops.aten._softmax.out(logits, -1, False, out=logits)  # in place: P
    lse = peak - probs.amax(-1, keepdim=True).log()
    logp = (picked - lse).detach()
    with torch.enable_grad():
        leaf = logp.requires_grad_()
        loss = chunk_loss(leaf, rows)
        (dlogp,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    if dlogp is None:
        dlogp = torch.zeros_like(logp)
    # the logits' gradient, in place of P: sum_k c_k (onehot(t_k) - P), as autograd's log-softmax backward makes it
    grad_logits = probs.mul_(-dlogp.sum(1, keepdim=True)).scatter_add_(1, targets, dlogp)
    grad_x = torch.mm(grad_logits, weights.weight) if want_x else None
    if weights.lora is not None and low is not None:
        a, b, scaling = weights.lora
        grad_a, grad_bt = grads
        assert grad_a is not None and grad_bt is not None
        grad_bt.addmm_(low.t(), grad_logits)  # B's gradient as (r, V): the fast layout
        dlow = rank_side(b.t(), grad_logits).mul_(scaling)  # s (G B)
        grad_a.addmm_(dlow.t(), x)
        if grad_x is not None:
            grad_x.addmm_(dlow, a)
    return logp, loss.detach(), grad_x


def _weights(unembed: Head, hidden: torch.Tensor) -> _Weights | None:
    """The head's tensors when it is a lean LoRA head or a plain `Linear`, all float32 like `hidden`."""
    if isinstance(unembed, LeanHead):
        base = unembed.base
        lora = (unembed.lora_a.weight.detach(), unembed.lora_b.weight.detach(), unembed.scaling)
    elif isinstance(unembed, torch.nn.Linear) and plain_linear(unembed):
        base, lora = unembed, None
    else:
        return None
    tensors = [hidden, base.weight, *([] if base.bias is None else [base.bias]), *(lora[:2] if lora else [])]
    if any(t.dtype != torch.float32 or t.device != hidden.device for t in tensors):
        return None
    if base.weight.requires_grad or (base.bias is not None and base.bias.requires_grad):
        return None  # a trained base head: autograd's
    bias = None if base.bias is None else base.bias.detach()
    return _Weights(base.weight.detach(), bias, lora)
