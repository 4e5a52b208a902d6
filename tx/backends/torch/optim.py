"""AdamW for one run: built over the run's LoRA parameters, re-configured on every step."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor
from torch.nn.utils import clip_grads_with_norm_, get_total_norm

from tx.types import AdamParams


def new_optimizer(params: Iterable[torch.nn.Parameter]) -> torch.optim.AdamW:
    """An AdamW over `params`; its hyperparameters are set by each `adam_step`."""
    return torch.optim.AdamW(list(params), lr=0.0, weight_decay=0.0)


def adam_step(optimizer: torch.optim.AdamW, adam: AdamParams) -> dict[str, float]:
    """Apply `adam` to the accumulated gradients, clip first if asked, then zero the gradients.

    Returns the total gradient norm before clipping and the learning rate used.
    """
    for group in optimizer.param_groups:
        group["lr"] = adam.learning_rate
        group["betas"] = (adam.beta1, adam.beta2)
        group["eps"] = adam.eps
        group["weight_decay"] = adam.weight_decay
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    grad_norm = get_total_norm([p.grad for p in params]) if params else torch.zeros(())
    if adam.grad_clip_norm > 0 and params:
        clip_grads_with_norm_(params, adam.grad_clip_norm, grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if isinstance(grad_norm, DTensor):  # parameters sharded over trainer workers: the norm of the whole
        grad_norm = grad_norm.full_tensor()
    return {"grad_norm": float(grad_norm), "learning_rate": adam.learning_rate}
