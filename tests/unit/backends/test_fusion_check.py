"""The fused-pass self-check (`tx/backends/torch/fusion_check.py`): a model whose LoRA layers keep each run's
rows to its own adapter passes, in float32 and in bfloat16 (where stacked and alone round differently); a pass
whose rows would go through every run's adapter at once fails, in both."""

from __future__ import annotations

import contextlib

import pytest
from backend_helpers import TINY_NAME

from tx.backends.torch import fusion_check
from tx.types import LoraConfig


def _checked(tiny_model_dir, dtype: str) -> bool:
    from tx.backends.torch.backend import TorchBackend
    from tx.config.sections import TrainerSection

    backend = TorchBackend({TINY_NAME: tiny_model_dir}, device="cpu", settings=TrainerSection(dtype=dtype))
    backend.create_model("run", TINY_NAME, LoraConfig(rank=4, seed=0))  # loads the base model
    return fusion_check.fuses_exactly(backend._hosts[TINY_NAME], backend.device, None, TINY_NAME)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_model_that_keeps_rows_to_their_adapter_passes(tiny_model_dir, dtype: str) -> None:
    assert _checked(tiny_model_dir, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_pass_that_mixes_the_runs_adapters_fails(tiny_model_dir, dtype: str, monkeypatch, caplog) -> None:
    # without the segmenting, every row goes through the sum of all active adapters
    monkeypatch.setattr(fusion_check, "segmented", lambda *args, **kwargs: contextlib.nullcontext())
    assert not _checked(tiny_model_dir, dtype)
    assert "runs train in turns, not in one pass: stacked rows differ from alone" in caplog.text
