"""Whether the trainer workers shard a base model (FSDP2, `sharded.py`) or each hold it whole (`replicated.py`).

Sharding the frozen base buys memory only: every pass then all-gathers each block's weights (forward and
again in backward), which on CPU over gloo costs more than the step's compute. A LoRA run's gradients are
tiny, so when the base fits, replicating it and summing the gradients once per step is the fast way. The
rule (`--trainer-shard-base auto`, the default): shard when holding the base whole would take more than half
of a worker's memory, that is, half the GPU's memory on a GPU, or, on CPU, N copies (N workers) more than
half of the machine's RAM. The ranks decide together (any rank that needs sharding makes all shard), so
their collectives line up. `always` and `never` force one way.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open

from tx.config.names import ShardBase


def shard_base(policy: ShardBase, path: Path, dtype: torch.dtype, device: torch.device, world_size: int) -> bool:
    """Whether to shard the base model in `path` over the group (collective when `policy` is "auto")."""
    if policy != "auto":
        return policy == "always"
    need = torch.tensor([int(too_big(base_bytes(path, dtype), device, world_size))], device=device)
    dist.all_reduce(need, op=dist.ReduceOp.MAX)
    return bool(need.item())


def too_big(size: int, device: torch.device, world_size: int) -> bool:
    """Whether a whole base of `size` bytes on each of `world_size` workers takes more than half their memory."""
    if device.type == "cuda":
        return size > torch.cuda.get_device_properties(device).total_memory / 2
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return size * world_size > ram / 2


def base_bytes(path: Path, dtype: torch.dtype) -> int:
    """The base model's weights in `dtype`, counted from its safetensors headers (nothing is loaded); the
    weight files' size where it has no safetensors."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return sum(f.stat().st_size for f in path.glob("*.bin"))
    elements = 0
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            elements += sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())
    return elements * dtype.itemsize
