"""How far apart two runs of one model are, by the same measure wherever tx checks itself: the trainer's packing
self-check (`tx/backends/torch/packing.py`) and the embedded engine's serving self-check
(`tx/inference/engines/embedded/selfcheck.py`).

Both compare log-softmax rows of the same positions: in float32 the largest logprob difference, in 16-bit the
largest KL divergence of a position (rounding differs with the shape of a computation, so single logprobs of
unlikely tokens move by more than a whole distribution does).
"""

from __future__ import annotations

import torch

FLOAT32_TOLERANCE = 1e-4
"""Most a logprob may differ in float32 (measured: ~2e-6 where two forms agree, 0.4-5 nats where they do not)."""
HALF_TOLERANCE = 1e-2
"""Most a position's KL divergence may be in 16-bit."""
HALF_TOKEN_TOLERANCE = 0.25
"""Most one token's logprob may differ in 16-bit, where only that logprob is known (an engine's prompt
logprobs, `tx/inference/manager/selfcheck.py`): rounding moves an unlikely token's by up to ~0.1 nats where two
forms agree; a broken form moves them by nats."""


def difference(got: torch.Tensor, want: torch.Tensor, full_precision: bool) -> float:
    """Max |logprob difference| (`full_precision`: a float32 model); else max KL(want || got) over positions.
    Both are (positions, vocab) log-softmax rows."""
    if full_precision:
        return float((got - want).abs().max())
    return float((want.exp() * (want - got)).sum(-1).max())


def tolerance(dtype: torch.dtype) -> float:
    """The bound on `difference` for a model whose weights are in `dtype`."""
    return FLOAT32_TOLERANCE if dtype == torch.float32 else HALF_TOLERANCE


def token_tolerance(dtype: torch.dtype) -> float:
    """The bound on the largest difference of single tokens' logprobs (no whole distribution to compare)."""
    return FLOAT32_TOLERANCE if dtype == torch.float32 else HALF_TOKEN_TOLERANCE
