"""The names settings choose between, on the ground floor so that every component imports them from here."""

from __future__ import annotations

from typing import Literal

EngineKindName = Literal["embedded", "vllm"]  # each kind's record: tx/inference/engines/kinds.py
Dtype = Literal["float32", "bfloat16", "float16"]  # base weights' dtype; LoRA, AdamW, logprobs stay float32
VllmLoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]  # the --max-lora-rank values vLLM takes
ShardBase = Literal["auto", "always", "never"]  # trainer workers: shard the frozen base with FSDP2?
# attention implementations a user may force; by default each model gets the best its family supports on the
# device (tx/models/attention.py)
AttnImplementation = Literal["eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3"]


def default_train_dtype(device: str) -> Dtype:
    """The trainer's default dtype for a `--device` value, without importing torch unless it is "auto"."""
    if device == "auto":
        import torch

        return "bfloat16" if torch.cuda.is_available() else "float32"
    return "bfloat16" if device.startswith("cuda") else "float32"
