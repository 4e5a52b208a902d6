"""The device mesh a JAX backend trains on, and where each array lives on it.

One mesh axis, "data", over the local devices. Micro-batch rows are split over it (data parallel); each base
weight of two or more dimensions is split over it along its first dimension when that divides evenly (FSDP
style: XLA gathers a weight where a pass needs it); LoRA weights, gradients and AdamW state are small and
replicated. With one device every sharding is trivial and the same code runs.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "data"


def local_mesh(platform: str | None = None, num_devices: int | None = None) -> Mesh:
    """A one-axis mesh over this process's devices (of `platform`, or JAX's default one; the first
    `num_devices` of them when given)."""
    devices = jax.local_devices(backend=platform)
    return Mesh(np.array(devices[:num_devices]), (AXIS,))


def rows(mesh: Mesh) -> NamedSharding:
    """Split an array's first axis (micro-batch rows) over the devices."""
    return NamedSharding(mesh, PartitionSpec(AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def place_base(mesh: Mesh, weights: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Base weights on the mesh: first axis split where it divides evenly, else replicated."""
    size = mesh.devices.size
    placed = {}
    for name, array in weights.items():
        split = array.ndim >= 2 and array.shape[0] % size == 0
        placed[name] = jax.device_put(array, rows(mesh) if split else replicated(mesh))
    return placed
