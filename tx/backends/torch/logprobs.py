"""Log-probabilities of target tokens, in float32, for a whole padded batch at once."""

from __future__ import annotations

import torch


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[target] for (B, T, V) logits and (B, T, K) targets -> (B, T, K)."""
    logits = logits.float()
    if targets.shape[-1] == 1:  # one target per position: fused log_softmax + gather
        flat = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), reduction="none"
        )
        return -flat.view(targets.shape)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets)
