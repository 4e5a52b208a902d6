"""Tensors on the control channel: safetensors bytes, and an AdamW state dict as (tensors, JSON meta).

An optimizer state dict `{"state": {index: {key: tensor}}, "param_groups": [...]}` becomes tensors named
`"<index>.<key>"` plus its param_groups as JSON, and back, so optimizer state moves without pickle and is
written to disk in today's `optimizer.pt` format by the API process.
"""

from __future__ import annotations

from typing import Any

import torch
from safetensors.torch import load, save


def to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    return save({name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}) if tensors else b""


def from_bytes(payload: bytes) -> dict[str, torch.Tensor]:
    return load(payload) if payload else {}


def flatten_optimizer(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {
        f"{index}.{key}": value
        for index, entry in state_dict["state"].items()
        for key, value in entry.items()
    }
    groups = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state_dict["param_groups"]
    ]
    return tensors, {"param_groups": groups}


def unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def split_prefixed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors named `<prefix><name>`, by `<name>`."""
    return {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}
