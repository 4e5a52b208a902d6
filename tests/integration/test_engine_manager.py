"""The engine manager with a real embedded engine (a subprocess), driven through its entry points as the
server drives it (`tests/live_manager.py`), without an API server.

Colocation is a lease on the accelerator, both ways. The device is a fake: the engine runs on cpu and is only
*declared* colocated (`EngineSettings(colocate=True)`), so the sleep/wake cycle runs as on a shared GPU.
- a sample that arrives during a training pass waits for the pass, and does not wake the engines meanwhile;
- a training pass waits for an in-flight sample only `training_wait_s`, then pauses it (abort), and the sample
  resumes after the pass with the tokens it had, so steady sampling cannot starve training.

Adapters a request generates with are not unloaded to make room for others. An engine that dies under many
requests is restarted once, and each request succeeds on the restarted engine.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_weights import random_adapter
from live_manager import LiveManager
from tx.inference.launch.local import EngineProcess, LocalLauncher
from tx.inference.manager import EngineManager, EngineSettings
from tx.models.tiny import write_tiny_text_model
from tx.types import SamplingParams

MODEL = "tiny"
WAIT_S = 0.5
MAX_ADAPTERS = 2
# Long enough that, unpaused, the training pass below would wait for it for seconds.
LONG = SamplingParams(max_tokens=2000, temperature=1.0, seed=3, stop_at_eos=False)


class CountingLauncher(LocalLauncher):
    """The real local launcher, counting the engines it starts."""

    starts = 0

    async def start(self, name: str, model_dir: Path) -> EngineProcess:
        self.starts += 1
        return await super().start(name, model_dir)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_text_model(tmp_path_factory.mktemp("tiny-model"), preset="tiny", seed=0)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[LiveManager]:
    launcher = CountingLauncher(tmp_path_factory.mktemp("engines"), "manager-test-secret-" + "x" * 16,
                                device="cpu", max_adapters=MAX_ADAPTERS)
    settings = EngineSettings(count=1, colocate=True, training_wait_s=WAIT_S,  # colocate: the fake device
                              max_adapters=MAX_ADAPTERS)
    live = LiveManager(EngineManager({MODEL: model_dir}, settings, launcher), MODEL)
    live.sample("warmup")
    yield live
    live.close()


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> list[Path]:
    """Three PEFT adapter directories with random LoRA weights, as sampler saves write them."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    dirs = []
    for seed in range(3):
        model, _ = random_adapter(base, seed, r=2, lora_alpha=4, targets=["q_proj", "v_proj"])
        model.save_pretrained(directory := tmp_path_factory.mktemp(f"adapter-{seed}"))
        dirs.append(directory)
    return dirs


def sleeping_level(live: LiveManager) -> int:
    (engine,) = live.engines().values()
    return engine["health"]["sleeping_level"]


def test_a_sample_during_a_training_pass_waits_for_the_pass(live: LiveManager) -> None:
    live.sample("before")
    assert live.state() == "awake"
    with live.manager.training_pass():  # this thread is the training thread
        assert live.state() == "asleep"
        during = live.sample_later("during")
        time.sleep(1.0)
        assert not during.done(), "a sample ran while the trainer held the device"
        assert live.state() == "asleep" and sleeping_level(live) == 1
    assert len(during.result(60).sequences[0].tokens) == 4
    assert live.state() == "awake"


def test_a_training_pass_pauses_a_long_sample_and_it_resumes_after(live: LiveManager) -> None:
    live.sample("warm")
    running = live.sample_later("long", params=LONG)
    time.sleep(1.0)  # well into its 2,000 tokens
    assert not running.done()
    entered = time.monotonic()
    with live.manager.training_pass():
        waited = time.monotonic() - entered
        # unpaused, the sample has ~6 s left here (a 2-core box); pausing it takes ~1 s
        assert waited < WAIT_S + 2.5, f"the training pass waited {waited:.1f} s for a sample"
        assert live.state() == "asleep"
        time.sleep(0.5)
        assert not running.done()
    result = running.result(120)
    sequence = result.sequences[0]
    assert len(sequence.tokens) == LONG.max_tokens and sequence.stop_reason == "length"
    assert len(sequence.logprobs) == LONG.max_tokens


def test_an_adapter_in_use_is_not_unloaded_to_make_room(live: LiveManager, adapter_dirs: list[Path]) -> None:
    """The engine holds MAX_ADAPTERS = 2: loading the third unloads the idle one, not the one generating."""
    first, second, third = adapter_dirs
    running = live.sample_later("on-first", params=LONG, weights_dir=first)
    time.sleep(1.0)
    assert not running.done()
    live.sample("on-second", weights_dir=second)
    live.sample("on-third", weights_dir=third)
    sequence = running.result(120).sequences[0]
    assert len(sequence.tokens) == LONG.max_tokens and sequence.stop_reason == "length"
    (engine,) = live.engines().values()
    assert len(engine["adapters"]) == MAX_ADAPTERS


def test_a_killed_engine_is_restarted_once_under_many_samplers(live: LiveManager) -> None:
    """16 requests see the engine die at once: one restart, and each request succeeds on the new engine."""
    launcher = live.manager.supervisor.launcher
    assert isinstance(launcher, CountingLauncher)
    live.sample("before-kill")
    starts = launcher.starts
    (engine,) = live.engines().values()
    received = engine["health"]["stats"]["num_requests"]
    params = [SamplingParams(max_tokens=200, temperature=1.0, seed=i, stop_at_eos=False) for i in range(16)]
    running = [live.sample_later(f"sampler-{i}", params=p) for i, p in enumerate(params)]
    while (engine := next(iter(live.engines().values())))["health"]["stats"]["num_requests"] < received + 16:
        time.sleep(0.02)  # kill once the engine holds all 16
    os.kill(engine["pid"], signal.SIGKILL)
    assert sum(not f.done() for f in running) >= 2, "too few requests were in flight to race"
    results = [f.result(180) for f in running]
    assert [len(r.sequences[0].tokens) for r in results] == [200] * 16
    assert launcher.starts == starts + 1, f"{launcher.starts - starts} engines started after one kill"
    assert live.sample("after-kill").sequences[0].tokens


def test_a_prestart_starts_the_engines_once_and_the_sample_uses_them(tmp_path: Path, model_dir: Path) -> None:
    """A sampler save of a run about to sample starts its engines at submission (`EngineManager.prestart`, not
    waiting): they come up without a sample, a second prestart starts nothing more, and the sample uses them."""
    launcher = CountingLauncher(tmp_path / "engines", "manager-test-secret-" + "x" * 16, device="cpu",
                                max_adapters=1)
    live = LiveManager(EngineManager({MODEL: model_dir}, EngineSettings(count=1, max_adapters=1), launcher), MODEL)
    try:
        assert live.state() == "absent"
        live.manager.prestart(MODEL)
        live.manager.prestart(MODEL)
        deadline = time.monotonic() + 300
        while live.state() != "awake" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live.state() == "awake" and launcher.starts == 1
        assert live.sample("after-prestart").sequences
        assert launcher.starts == 1
    finally:
        live.close()
