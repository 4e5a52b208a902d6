"""Engine test fixtures: one live embedded engine per module (`tiny_model_dir` and `reference_model` come from
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from live_engine import EmbeddedEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory) -> Iterator[EmbeddedEngine]:
    with EmbeddedEngine(tiny_model_dir, tmp_path_factory.mktemp("engine"), max_adapters=4) as engine:
        yield engine
