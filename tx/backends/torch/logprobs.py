"""Target log-probabilities from final hidden states, a chunk of positions at a time (never tokens x vocab).

The unembedding (`lm_head`, with a run's LoRA on it when `train_unembed`: `head.py` computes it lean) is applied
to `chunk` positions at once: their logits are made in float32, log-softmaxed, the targets' entries gathered,
and dropped. The extra memory is O(chunk x vocab): the chunk's logits, their log-softmax and its gradient, about
3 x chunk x vocab x 4 bytes at the peak. Two ways to get gradients:

- `per_token_backward` (losses that are a sum of per-token terms): each chunk's loss terms are made and
  backpropagated to the hidden states at once, while its logits are alive, so the unembedding runs once
  forward and once backward, as in the naive computation; for a plain head the backward is written out by
  hand (`head_grad.py`: one (chunk, vocab) buffer, the softmax in place).
- `target_logprobs` under autograd (any loss, e.g. gspo's per-sequence ratio): each chunk runs under
  non-reentrant activation checkpointing and backward recomputes its logits (one more unembedding pass).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from tx.backends.torch.head import Head
from tx.backends.torch.head_grad import per_token_by_hand

# Logits per chunk (positions x vocab). 16M float32 values = 64 MiB per buffer: ~110 positions at Qwen3's
# vocabulary (151,936), all of them for a small vocabulary. The head holds about three such buffers at its
# peak (~190 MiB; at 32M it was ~390 MiB, at the same speed on CPU; at 8M it was slower).
CHUNK_LOGITS = 16 << 20


def chunk_positions(vocab_size: int, chunk_logits: int | None = None) -> int:
    """Positions per chunk so that one chunk's logits hold about `chunk_logits` (CHUNK_LOGITS) values."""
    return max(1, (CHUNK_LOGITS if chunk_logits is None else chunk_logits) // vocab_size)


def target_logprobs(
    hidden: torch.Tensor, unembed: Head, targets: torch.Tensor, chunk: int
) -> torch.Tensor:
    """log_softmax(unembed(hidden))[targets] in float32: (N, H) hidden, (N, K) targets -> (N, K)."""
    pieces = []
    grads = torch.is_grad_enabled()
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start : start + chunk], targets[start : start + chunk]
        if grads:
            pieces.append(checkpoint(_chunk_logprobs, unembed, h, t, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(unembed, h, t))
    return torch.cat(pieces) if len(pieces) > 1 else pieces[0]


def per_token_backward(
    hidden: torch.Tensor,
    unembed: Head,
    targets: torch.Tensor,
    chunk: int,
    chunk_loss: Callable[[torch.Tensor, slice], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target logprobs of (N, H) `hidden`, the loss, and d loss / d hidden, a chunk at a time.

    `chunk_loss(logp, rows)` is the summed loss of the positions `rows` given their (rows, K) logprobs; each
    chunk's is backpropagated at once (into the unembedding's LoRA and the returned hidden-state gradient).
    Returns (logp (N, K) detached, loss (scalar, detached), grad (N, H)). A plain head (a lean LoRA head or a
    plain `Linear`, float32) gets its gradient by hand, without autograd over the logits (`head_grad.py`)."""
    by_hand = per_token_by_hand(hidden, unembed, targets, chunk, chunk_loss)
    if by_hand is not None:
        return by_hand
    leaf = hidden.detach().requires_grad_()
    pieces, total = [], hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], chunk):
        rows = slice(start, start + chunk)
        logp = _chunk_logprobs(unembed, leaf[rows], targets[rows])
        loss = chunk_loss(logp, rows)
        loss.backward()
        pieces.append(logp.detach())
        total += loss.detach()
    grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
    return torch.cat(pieces), total, grad


def _chunk_logprobs(unembed: Head, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = unembed(hidden).float()
    if targets.shape[1] == 1:  # fused log_softmax + gather, with a cheap backward
        return -torch.nn.functional.cross_entropy(logits, targets[:, 0], reduction="none")[:, None]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets)
