"""The torch trainer's settings, as the server passes them (no torch import: the API builds this).

`None` means "choose for the device": `resolve` fills every field once the device is known.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tx.config import Dtype, ShardBase

# Tokens per micro-batch on CPU (the JAX backend uses it too). scripts/bench/train_memory.py at Qwen3's
# vocabulary (151,936), 32 x 2,048 tokens in micro-batches of 8,192: hidden 256 peaked 870 MiB above
# model + optimizer (with memory.return_freed_tensors_to_os; 1,324 MiB without it).
CPU_MICRO_BATCH_TOKENS = 8192


@dataclass(frozen=True)
class TrainerSettings:
    micro_batch_tokens: int | None = None
    """Tokens per micro-batch (a longer single sequence runs alone). None: CPU_MICRO_BATCH_TOKENS on CPU,
    derived from free memory and the model's size on CUDA."""
    dtype: Dtype | None = None
    """Base weights' dtype. None: bfloat16 on CUDA, float32 on CPU. LoRA weights, AdamW state, logprobs and
    losses are float32 whatever this is."""
    gradient_checkpointing: bool | None = None
    """Recompute each decoder layer's activations in backward. None: on with CUDA, off on CPU."""
    max_sequence_tokens: int | None = None
    """Longest datum accepted (below the model's context); None: the context is the only limit."""
    shard_base: ShardBase = "auto"
    """Trainer workers only: shard the frozen base over them with FSDP2 ("always"), hold it whole on each
    ("never"), or shard only a base that does not fit on each worker ("auto"; `workers/policy.py`)."""

    def resolved(self, device_type: str) -> TrainerSettings:
        """These settings with dtype and checkpointing chosen for `device_type` ("cpu", "cuda")."""
        cuda = device_type == "cuda"
        return replace(
            self,
            dtype=self.dtype or ("bfloat16" if cuda else "float32"),
            gradient_checkpointing=(
                cuda if self.gradient_checkpointing is None else self.gradient_checkpointing
            ),
        )
