"""Engine test fixtures: tiny models on disk, a reference transformers model, a live engine process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from engine_helpers import Engine, start_engine

from tx.models.tiny import write_tiny_text_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The ~0.4M-parameter Qwen3 ("tiny" preset) with its Qwen-like tokenizer."""
    return write_tiny_text_model(tmp_path_factory.mktemp("tiny-model"), preset="tiny", seed=0)


@pytest.fixture(scope="session")
def reference_model(tiny_model_dir):
    """The same weights as a plain transformers model in this process (fp32, sdpa)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_model_dir), dtype=torch.float32, attn_implementation="sdpa"
    )
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory) -> Iterator[Engine]:
    engine = start_engine(tiny_model_dir, tmp_path_factory.mktemp("engine"), max_adapters=4)
    yield engine
    engine.close()
