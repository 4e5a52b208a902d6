"""Torch device names, resolved one way for the trainer and the engines."""

from __future__ import annotations

import torch


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" -> cuda when there is a GPU, else cpu. A bare "cuda" means the current CUDA device, so it
    gets that index: every holder of the device names the same GPU, and two names never mean one GPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device
