"""A JAX run's weights and AdamW state in tx's one checkpoint format (`tx/backends/torch/checkpoint.py`).

Weights are written under their PEFT names; the AdamW state is written as torch's `AdamW.state_dict()`
(built by a torch AdamW over the same tensors, parameters numbered in sorted PEFT-name order, as the torch
backend numbers them), so either backend resumes the other's runs, optimizer included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
import torch

from tx.backends.jax import lora as lora_mod
from tx.backends.torch import checkpoint
from tx.backends.torch.optim import new_optimizer
from tx.types import UserError

CPU = torch.device("cpu")


def to_torch(array: jax.Array) -> torch.Tensor:
    """A CPU torch tensor of a (replicated) JAX array: zero-copy through DLPack when it is on the CPU."""
    local = array.addressable_data(0)
    if local.devices().pop().platform == "cpu":
        return torch.from_dlpack(local)
    return torch.from_numpy(np.asarray(local))


def torch_optimizer_state(weights: dict[str, torch.Tensor], mu: dict, nu: dict, count: int) -> dict[str, Any]:
    """torch AdamW's state_dict for parameters `weights` (PEFT names, sorted) with moments `mu`, `nu`."""
    params = [torch.nn.Parameter(tensor.clone()) for tensor in weights.values()]
    optimizer = new_optimizer(params)
    if count > 0:
        for param, name in zip(params, weights):
            optimizer.state[param] = {
                "step": torch.tensor(float(count)),
                "exp_avg": to_torch(mu[name]).clone(),
                "exp_avg_sq": to_torch(nu[name]).clone(),
            }
    return optimizer.state_dict()


@dataclass
class LoadedState:
    weights: dict[str, np.ndarray]  # PEFT name -> array
    moments: tuple[dict[str, np.ndarray], dict[str, np.ndarray], int] | None  # (mu, nu, count); None = fresh


def read(directory: Path, expected: dict[str, tuple[int, ...]], with_optimizer: bool) -> LoadedState:
    """Weights (and AdamW moments) of a state directory, checked against the run's {PEFT name: shape}."""
    tensors = checkpoint.read_weights(directory, CPU)
    if set(tensors) != set(expected):
        missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
        raise UserError(
            f"checkpoint {directory} does not fit the run: missing {missing[:3]}, extra {extra[:3]}"
        )
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise UserError(f"checkpoint {directory}: {name} has shape {tuple(tensors[name].shape)}, "
                            f"expected {shape}")
    weights = {name: tensors[name].float().numpy() for name in sorted(expected)}
    moments = _read_moments(directory, list(weights)) if with_optimizer else None
    return LoadedState(weights, moments)


def _read_moments(directory: Path, names: list[str]):
    saved = checkpoint.read_optimizer_state(directory, CPU)
    try:
        groups, entries = saved["param_groups"], saved["state"]
        if sum(len(group["params"]) for group in groups) != len(names):
            raise ValueError(f"it holds {sum(len(g['params']) for g in groups)} parameters, not {len(names)}")
        if not entries:
            return None
        mu = {name: entries[i]["exp_avg"].float().numpy() for i, name in enumerate(names)}
        nu = {name: entries[i]["exp_avg_sq"].float().numpy() for i, name in enumerate(names)}
        return mu, nu, int(entries[0]["step"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"optimizer state in {directory} does not fit the run: {exc}") from exc


def peft_shapes(paths: dict[str, tuple[int, int]], rank: int) -> dict[str, tuple[int, ...]]:
    """{PEFT name: shape} of an adapter over modules {path: (out, in)}."""
    shapes = {}
    for path, (out_dim, in_dim) in paths.items():
        name_a, name_b = lora_mod.peft_names(path)
        shapes[name_a], shapes[name_b] = (rank, in_dim), (out_dim, rank)
    return shapes
