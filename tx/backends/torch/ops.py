"""torch's array functions for the shared loss formulas (`tx.backends.losses`)."""

from __future__ import annotations

import torch

from tx.backends.losses import ArrayOps

TORCH_OPS = ArrayOps(exp=torch.exp, minimum=torch.minimum, clip=torch.clamp, stop_gradient=torch.Tensor.detach)
