"""Target log-probabilities from final hidden states, a chunk of positions at a time (never tokens x vocab).

The unembedding (`lm_head`, with a run's LoRA on it when `train_unembed`) is applied to `chunk` positions
at once: their logits are made in float32, reduced to log-sum-exp and the targets' logits, and dropped.
In a pass that needs gradients each chunk runs under non-reentrant activation checkpointing, so backward
recomputes that chunk's logits instead of keeping them. The extra memory is O(chunk x vocab): the
chunk's logits, their exponentials and their gradient, about 3 x chunk x vocab x 4 bytes at the peak.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

# Logits per chunk (positions x vocab). 16M float32 values = 64 MiB per buffer: ~110 positions at Qwen3's
# vocabulary (151,936), all of them for a small vocabulary. Larger chunks were not faster on CPU
# (scripts/bench/train_memory.py), smaller ones pay per-call overhead.
CHUNK_LOGITS = 16 << 20


def chunk_positions(vocab_size: int, chunk_logits: int | None = None) -> int:
    """Positions per chunk so that one chunk's logits hold about `chunk_logits` (CHUNK_LOGITS) values."""
    return max(1, (CHUNK_LOGITS if chunk_logits is None else chunk_logits) // vocab_size)


def target_logprobs(
    hidden: torch.Tensor, unembed: torch.nn.Module, targets: torch.Tensor, chunk: int
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


def _chunk_logprobs(unembed: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = unembed(hidden).float()
    return logits.gather(-1, targets) - torch.logsumexp(logits, dim=-1, keepdim=True)
