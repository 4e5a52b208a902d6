"""Memory policy of the torch trainer: the micro-batch budget on a GPU, and running out of memory.

The budget on CUDA comes from the device memory left after the base model is loaded and an estimate of
the activation bytes each token keeps for backward (all decoder layers' saved tensors, or only each
layer's input with gradient checkpointing, plus one layer's worth recomputed). The chunked head adds a
fixed O(chunk x vocab), covered by the reserve. The estimate is deliberately generous per token.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

MIN_TOKENS, MAX_TOKENS = 1024, 256 * 1024
RESERVE_SHARE = 0.25  # of free memory kept back: allocator fragmentation, optimizer state, engines waking
RESERVE_BYTES = 2 << 30  # and the chunked head's logits and their gradient


class TrainerOutOfMemory(RuntimeError):
    """A step ran out of memory; the server reports it as a server error and goes on."""


def activation_bytes_per_token(
    num_layers: int, hidden: int, intermediate: int, dtype_bytes: int, checkpointing: bool
) -> int:
    """Bytes of activations one token keeps for backward (an over-estimate for Llama/Qwen-style layers).

    A layer saves about 16 hidden-wide tensors (norms, q/k/v/o, residuals, LoRA inputs) and 5
    intermediate-wide ones (gate, up, the activation and its product); with checkpointing a layer keeps
    only its input, and one layer at a time is recomputed in full."""
    full_layer = (16 * hidden + 5 * intermediate) * dtype_bytes
    if checkpointing:
        return num_layers * hidden * dtype_bytes + full_layer
    return num_layers * full_layer


def cuda_micro_batch_tokens(free_bytes: int, per_token: int) -> int:
    """Tokens per micro-batch that fit `free_bytes` after the reserve, a multiple of 1024 in range."""
    usable = free_bytes * (1 - RESERVE_SHARE) - RESERVE_BYTES
    tokens = int(usable // max(per_token, 1)) // 1024 * 1024
    return max(MIN_TOKENS, min(MAX_TOKENS, tokens))


def default_cuda_budget(
    model: PreTrainedModel, device: torch.device, dtype: torch.dtype, checkpointing: bool
) -> int:
    """The CUDA micro-batch budget for `model`, already loaded on `device`."""
    config = model.config.get_text_config()
    per_token = activation_bytes_per_token(
        int(config.num_hidden_layers),
        int(config.hidden_size),
        int(getattr(config, "intermediate_size", 4 * config.hidden_size)),
        torch.empty((), dtype=dtype).element_size(),
        checkpointing,
    )
    free, _ = torch.cuda.mem_get_info(device)
    return cuda_micro_batch_tokens(free, per_token)


def cuda_full_activations_budget(model: PreTrainedModel, device: torch.device, dtype: torch.dtype) -> int:
    """The largest pass (tokens) on `device` that fits keeping every layer's activations: smaller ones skip
    gradient checkpointing's recompute (at 8 x 128 tokens of Qwen3-0.6B on an H100, 0.33 s a
    forward_backward rather than 0.45 s)."""
    tokens = default_cuda_budget(model, device, dtype, checkpointing=False)
    logger.info("%s: gradient checkpointing only above %d tokens a pass", type(model).__name__, tokens)
    return tokens


# Heap blocks at least this large are mapped on their own and unmapped when freed (glibc's M_MMAP_THRESHOLD).
HEAP_MMAP_THRESHOLD = 8 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h


def return_freed_tensors_to_os() -> bool:
    """Make freed CPU tensors of 8 MiB and up give their pages back at once (glibc only; False elsewhere).

    glibc raises its mmap threshold to the largest block freed so far, up to 32 MiB, so after the first
    micro-batch the activations (8-32 MiB each at 8,192 tokens) land in the heap, where freed blocks
    stay in the process and fragment: the trainer's RSS grew with the number of micro-batches a request
    took. A fixed threshold keeps it near the live tensors. Measured (scripts/bench/train_memory.py shapes:
    hidden 256, Qwen3's vocabulary, 32 x 2,048 tokens in micro-batches of 8,192, peak RSS above model +
    optimizer): glibc's default 1,324 MiB, 8 MiB 870 MiB, 1 MiB 716 MiB, all at the same speed. A 1 MiB
    threshold made small steps 50% slower (every mid-sized tensor faulted in afresh: the bench model's
    8 x 128-token step 0.86 -> 1.32 s); 8 MiB costs them 3-7%.
    """
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    done = bool(mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD))
    if not done:
        logger.warning("could not fix the heap's mmap threshold: CPU training memory may fragment")
    return done


OUT_OF_MEMORY = (torch.cuda.OutOfMemoryError, MemoryError)


def release(device: torch.device) -> None:
    """Give memory held by dropped tensors back (after a failed step)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def out_of_memory_message(exc: BaseException, device: torch.device, budget: int) -> str:
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return (
        f"the training step ran out of memory on {device} with micro-batches of up to {budget} tokens "
        f"({detail}); lower --train-micro-batch-tokens, or send shorter sequences"
    )
