"""The torch trainer's device defaults (no torch import). Its settings are `TrainerSection` (`tx/config/`),
which `TrainerSection.resolved` completes for the device."""

from __future__ import annotations

# Tokens per micro-batch on CPU (the JAX backend uses it too). scripts/bench/train_memory.py at Qwen3's
# vocabulary (151,936), 32 x 2,048 tokens in micro-batches of 8,192: hidden 256 peaked 870 MiB above
# model + optimizer (with memory.return_freed_tensors_to_os; 1,324 MiB without it).
CPU_MICRO_BATCH_TOKENS = 8192
