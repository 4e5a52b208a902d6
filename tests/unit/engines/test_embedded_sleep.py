"""Sleep frees the weights from the engine process's RAM; wake restores correct outputs.

Uses the ~21M-parameter "bench" model, so the weights (~85 MB) dominate what sleep can free.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from live_engine import EmbeddedEngine
from tx.models.tiny import write_tiny_text_model

PROMPT = [11, 250, 3000, 42, 7, 999]


@pytest.fixture(scope="module")
def bench_engine(tmp_path_factory):
    model_dir = write_tiny_text_model(tmp_path_factory.mktemp("bench-model"), preset="bench", seed=0)
    with EmbeddedEngine(model_dir, tmp_path_factory.mktemp("bench-engine")) as engine:
        engine.weight_bytes = (Path(model_dir) / "model.safetensors").stat().st_size
        yield engine


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _greedy(engine) -> list[int]:
    return engine.generate(prompt_token_ids=PROMPT, max_tokens=12, temperature=0.0, stop_at_eos=False)[
        "sequences"][0]["token_ids"]


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_frees_weights_and_wake_restores(bench_engine, level):
    engine = bench_engine
    expected = _greedy(engine)
    before = _rss_bytes(engine.pid)
    state = engine.post("/sleep", {"level": level})
    assert state["sleeping_level"] == level
    freed = before - _rss_bytes(engine.pid)
    weight_mb = engine.weight_bytes / 1e6
    assert freed >= 0.8 * engine.weight_bytes, f"freed {freed / 1e6:.1f} MB of {weight_mb:.1f} MB weights"
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(_greedy, engine)
        time.sleep(0.3)
        assert not queued.done(), "a request sent while asleep waits for wake_up"
        engine.post("/wake_up", {"tags": ["weights"]})
        time.sleep(0.2)
        assert not queued.done() and engine.health()["asleep_tags"] == ["kv_cache"]
        assert engine.post("/wake_up", {"tags": ["kv_cache"]})["sleeping_level"] == 0
        assert queued.result(timeout=60) == expected
    assert _greedy(engine) == expected
