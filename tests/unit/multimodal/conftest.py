"""Fixtures for image inputs: a tiny Qwen3-VL on disk."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tx.models.tiny_vlm import write_tiny_vlm

    return write_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=0)
