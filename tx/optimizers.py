"""The optimizers a run trains with, as the core, the trainers and the API's edge see them: AdamW's and Dimuon's
per-step parameters, and the optimizer chosen at create_model (docs/optimizers.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union, get_args

from tx.types import UserError


@dataclass(frozen=True)
class AdamParams:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0

    def validate(self) -> None:
        if not self.learning_rate >= 0:
            raise UserError(f"learning_rate must be >= 0, got {self.learning_rate}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise UserError(f"{name} must be in [0, 1), got {value}")
        if not self.eps > 0:
            raise UserError(f"eps must be > 0, got {self.eps}")
        if not self.weight_decay >= 0:
            raise UserError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not self.grad_clip_norm >= 0:
            raise UserError(f"grad_clip_norm must be >= 0 (0 = off), got {self.grad_clip_norm}")


OptimizerName = Literal["adamw", "dimuon"]


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer a run trains with, fixed for its life (the SDK's AdamOptimizerConfig / DimuonOptimizerConfig)."""

    kind: OptimizerName = "adamw"
    version: int = 1

    def check(self) -> None:
        if self.kind not in get_args(OptimizerName):
            raise UserError(f"optimizer {self.kind!r} is not supported: this server trains with adamw or dimuon")
        if self.version != 1:
            raise UserError(f"{self.kind} version {self.version} is not supported: this server has version 1")


ADAMW = OptimizerConfig()
DIMUON = OptimizerConfig("dimuon")


@dataclass(frozen=True)
class DimuonParams:
    """One Dimuon step (tx's formula: tx/backends/torch/dimuon.py)."""

    learning_rate: float
    grad_clip_norm: float = 0.0  # <= 0: no clipping
    beta1: float = 0.9

    def validate(self) -> None:
        if not self.learning_rate >= 0:
            raise UserError(f"learning_rate must be >= 0, got {self.learning_rate}")
        if not 0.0 <= self.beta1 < 1.0:
            raise UserError(f"beta1 must be in [0, 1), got {self.beta1}")
        if self.grad_clip_norm != self.grad_clip_norm:
            raise UserError("grad_clip_norm must be a number")


OptimParams = Union[AdamParams, DimuonParams]


def optimizer_of(params: OptimParams) -> OptimizerConfig:
    return DIMUON if isinstance(params, DimuonParams) else ADAMW


def check_params_fit(optimizer: OptimizerConfig, params: OptimParams) -> None:
    """A UserError unless `params` are a step of `optimizer` (AdamParams for adamw, DimuonParams for dimuon)."""
    if optimizer_of(params).kind != optimizer.kind:
        wanted = "DimuonParams" if optimizer.kind == "dimuon" else "AdamParams"
        raise UserError(f"this run trains with {optimizer.kind} (chosen at create_model): optim_step takes {wanted}")
