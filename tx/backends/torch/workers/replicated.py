"""Runs on a base model every worker holds whole: data parallel, one small all-reduce per step.

A LoRA run trains a few million parameters at most; its frozen base is the bulk of the model. When the base
fits on every worker (`policy.py`), each worker loads it once and shares it among all runs on it, as the
in-process trainer does, and runs the ordinary trainer code on its share of each step's datums, with no
communication at all during `forward_backward`. `optim_step` first sums the ranks' accumulated LoRA
gradients with ONE all_reduce of one flat buffer (which also carries, per parameter, whether any rank has a
gradient: a parameter no datum reached keeps `grad=None`, as in one process), then every rank applies the
same AdamW step to the same summed gradients, so the replicas stay identical. Losses are SUMS over tokens
(`losses.py`), so summed gradients equal a one-process run's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tx.backends.torch.workers.rank_backend import RankTorchBackend
from tx.optimizers import OptimParams
from tx.types import OptimStepResult


class ReplicatedTorchBackend(RankTorchBackend):
    def optim_step(self, model_id: str, params: OptimParams) -> OptimStepResult:
        self.sum_gradients(model_id)
        return super().optim_step(model_id, params)

    def sum_gradients(self, model_id: str) -> None:
        """Every rank's accumulated gradients of the run, summed, on every rank (one collective)."""
        params = list(self._run(model_id).params.values())
        if not params:
            return
        device, dtype = params[0].device, params[0].dtype
        present = torch.tensor([p.grad is not None for p in params], dtype=dtype, device=device)
        parts = [
            torch.zeros(p.numel(), dtype=dtype, device=device) if p.grad is None else p.grad.reshape(-1)
            for p in params
        ]
        flat = torch.cat([present, *parts])
        dist.all_reduce(flat)
        offset, reached = len(params), flat[: len(params)].tolist()
        for param, any_grad in zip(params, reached):
            part = flat[offset : offset + param.numel()]
            param.grad = part.view_as(param) if any_grad > 0 else None
            offset += param.numel()
