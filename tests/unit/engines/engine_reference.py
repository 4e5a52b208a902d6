"""What a plain transformers forward says, to compare the engine against."""

from __future__ import annotations

import pytest
import torch
from reference_logprobs import token_logprobs


def assert_raw_logprobs(model, prompt: list[int], sequence: dict) -> None:
    """The engine's logprobs of `sequence` equal the model's log_softmax at its tokens (1e-4, fp32)."""
    expected = token_logprobs(model, prompt, sequence["token_ids"])
    assert sequence["logprobs"] == pytest.approx(expected, abs=1e-4)


def prompt_logprobs(model, prompt: list[int]) -> list[float]:
    """Logprob of prompt token i given tokens < i, for i >= 1."""
    return token_logprobs(model, prompt[:1], prompt[1:])


def greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """`model.generate` greedy; the returned tokens end at (and include) the first EOS."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens, do_sample=False,
        )
    new = out[0, len(prompt):].tolist()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    for i, token in enumerate(new):
        if token in eos:
            return new[: i + 1]
    return new
