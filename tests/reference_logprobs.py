"""The reference every engine's logprobs are checked against: an HF transformers model's own forward."""

from __future__ import annotations

from pathlib import Path

import torch


def load_reference(model_dir: Path):
    """The model in `model_dir` as a plain transformers model in this process (fp32, sdpa, cpu, eval)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="sdpa")
    return model.eval().requires_grad_(False)


def token_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    """log_softmax of the fp32 logits at each completion token, given everything before it (model on cpu)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return logprobs[positions, torch.tensor(completion)].tolist()
