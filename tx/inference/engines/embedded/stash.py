"""Level-1 sleep's stash: every parameter of the engine's model written to a private file and freed, and read
back at wake; and handing freed memory back (to the OS, to the GPU)."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc keeps them otherwise), and freed GPU
    blocks back to the device (torch's caching allocator keeps them otherwise)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def stash_parameters(model: torch.nn.Module, stash_dir: Path | None) -> Path:
    """Write every parameter of `model` (adapters included) to a private safetensors file and free it; the file."""
    from safetensors.torch import save_file

    params = dict(model.named_parameters())
    fd, path = tempfile.mkstemp(prefix="tx-engine-stash-", suffix=".safetensors", dir=stash_dir)
    os.close(fd)  # mkstemp made it 0600: private to this user
    save_file({name: p.detach().to("cpu").contiguous() for name, p in params.items()}, path)
    for param in params.values():
        param.data = torch.empty(0, dtype=param.dtype, device=param.device)
    logger.info("sleep level 1: %d tensors stashed to %s", len(params), path)
    return Path(path)


def restore_parameters(model: torch.nn.Module, stash: Path) -> None:
    """Read `model`'s parameters back from `stash` (into private memory, not pages of the file) and delete it."""
    from safetensors.torch import load_file

    loaded = load_file(str(stash))
    for name, param in model.named_parameters():
        tensor = loaded.pop(name)
        param.data = tensor.clone() if param.device.type == "cpu" else tensor.to(param.device)
    stash.unlink(missing_ok=True)
