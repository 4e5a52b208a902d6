"""A run's optimizer, built over its LoRA parameters and re-configured on every step: AdamW (torch's), or
Dimuon (tx's, `dimuon.py`), as chosen when the run was created."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch.distributed.tensor import DTensor
from torch.nn.utils import clip_grads_with_norm_, get_total_norm

from tx.backends.torch.dimuon import Dimuon
from tx.optimizers import ADAMW, DimuonParams, OptimizerConfig, OptimParams, check_params_fit


def new_optimizer(params: Iterable[torch.nn.Parameter], config: OptimizerConfig = ADAMW) -> torch.optim.Optimizer:
    """The run's optimizer over `params`; its hyperparameters are set by each `optimizer_step`."""
    if config.kind == "dimuon":
        return Dimuon(params)
    params = list(params)
    return torch.optim.AdamW(params, lr=0.0, weight_decay=0.0, fused=_fused_adamw(params))


def optimizer_of(optimizer: torch.optim.Optimizer) -> OptimizerConfig:
    return OptimizerConfig("dimuon") if isinstance(optimizer, Dimuon) else ADAMW


def optimizer_step(optimizer: torch.optim.Optimizer, params: OptimParams) -> dict[str, float]:
    """Apply `params` to the accumulated gradients, clip first if asked, then zero the gradients.

    Returns the total gradient norm before clipping and the learning rate used.
    """
    _configure(optimizer, params)
    tensors = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    grad_norm = get_total_norm([p.grad for p in tensors]) if tensors else torch.zeros(())
    if params.grad_clip_norm > 0 and tensors:
        clip_grads_with_norm_(tensors, params.grad_clip_norm, grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if isinstance(grad_norm, DTensor):  # parameters sharded over trainer workers: the norm of the whole
        grad_norm = grad_norm.full_tensor()
    return {"grad_norm": float(grad_norm), "learning_rate": params.learning_rate}


def _fused_adamw(params: Sequence[torch.Tensor]) -> bool | None:
    """True (torch's fused AdamW kernel) for plain CPU parameters, None (torch's default) for any other.

    On CPU torch's default is a loop of ~10 ops per tensor; the fused kernel makes one pass per tensor (the peer
    workload's optim_step 1.37 -> 0.74 ms, docs/operations.md#the-training-steps-overhead), the same update up to
    float rounding. CUDA's default (foreach) is already batched; trainer workers' sharded (DTensor) parameters
    keep the default. Set again at every step: a loaded optimizer state brings its saver's setting."""
    return all(p.device.type == "cpu" and not isinstance(p, DTensor) for p in params) or None


def _configure(optimizer: torch.optim.Optimizer, params: OptimParams) -> None:
    check_params_fit(optimizer_of(optimizer), params)
    for group in optimizer.param_groups:
        if isinstance(optimizer, torch.optim.AdamW):
            group["fused"] = _fused_adamw(group["params"])
        group["lr"] = params.learning_rate
        if isinstance(params, DimuonParams):
            group["beta1"] = params.beta1
        else:
            group["betas"] = (params.beta1, params.beta2)
            group["eps"] = params.eps
            group["weight_decay"] = params.weight_decay
