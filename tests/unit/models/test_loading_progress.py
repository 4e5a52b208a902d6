"""A base model's load is tracked: its share of weights rises to 1 as transformers loads them (read off its own
progress bar), the log says so every PROGRESS_EVERY_S and at the end, and /api/v1/healthz lists it while it
runs (by its hub id or directory name, never its path)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import pytest
import torch

from tx.api.routes.client import healthz
from tx.models import loading as tracking
from tx.models.auto import load_frozen
from tx.models.tiny import write_tiny_text_model


def test_a_load_reports_its_share_to_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    model = write_tiny_text_model(tmp_path / "tiny-model")
    monkeypatch.setattr(tracking, "PROGRESS_EVERY_S", 0.001)
    seen: list[tuple[str, int, int | None]] = []
    loader = threading.Thread(target=load_frozen, args=(model, torch.device("cpu"), torch.float32, "sdpa"))
    with caplog.at_level(logging.INFO, logger="tx.models.loading"):
        loader.start()
        while loader.is_alive():
            seen += [(load.model, load.done, load.total) for load in tracking.in_progress()]
            time.sleep(0.0002)
        loader.join()
    weights = len(list(torch.nn.Module.state_dict(load_frozen(model, torch.device("cpu"), torch.float32, "sdpa"))))
    assert seen and {name for name, _, _ in seen} == {"tiny-model"}  # its directory's name, never its path
    dones = [done for _, done, _ in seen]
    assert dones == sorted(dones) and seen[-1][1:] == (weights, weights), seen[-3:]
    assert any("% of" in r.message for r in caplog.records), caplog.text
    assert "loaded tiny-model in" in caplog.text and f"({weights} weights)" in caplog.text
    assert tracking.in_progress() == []  # over: no longer listed


def test_healthz_lists_the_loads_running() -> None:
    cache_dir = Path("/cache/hub/models--Qwen--Qwen3-8B/snapshots/0123abc")
    with tracking.loading(cache_dir) as load:
        load.total, load.done = 10, 4
        answer = asyncio.run(healthz())
    assert answer.status == "ok" and len(answer.loading) == 1
    assert answer.loading[0].model == "Qwen/Qwen3-8B" and answer.loading[0].fraction == pytest.approx(0.4)
    assert asyncio.run(healthz()).loading == []
