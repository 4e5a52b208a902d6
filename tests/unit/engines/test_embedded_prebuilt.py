"""What a standby engine builds before its config arrives (`embedded/prebuilt.py`): the served model's tokenizer,
which the engine that then loads that model serves with, instead of building another."""

from __future__ import annotations

from pathlib import Path

import pytest

from tx.inference.engines.embedded import prebuilt
from tx.inference.engines.embedded.weights import Weights

TEXT = "the first sample of a run"


def test_the_engine_serves_with_the_tokenizer_its_standby_built(tiny_model_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    reference = prebuilt.load_tokenizer(tiny_model_dir)
    assert reference is not None
    prebuilt.prebuild([tiny_model_dir])
    loads: list[Path] = []
    monkeypatch.setattr(prebuilt, "load_tokenizer", lambda d: loads.append(d) or reference)
    first = Weights(tiny_model_dir, max_adapters=1)
    assert loads == [] and first.tokenizer is not None  # the standby's: none built at load
    assert first.tokenizer.encode(TEXT) == reference.encode(TEXT)
    Weights(tiny_model_dir, max_adapters=1)
    assert loads == [tiny_model_dir]  # taken once: the next engine of this model builds its own
