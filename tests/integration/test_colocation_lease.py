"""Colocation is a lease on the accelerator, both ways, with a real embedded engine (a subprocess) driven by the
real EngineManager. The device is a fake: the engine runs on cpu and is only *declared* colocated
(`EngineSettings(colocate=True)`), so the sleep/wake cycle runs as it does on a shared GPU.

- a sample that arrives during a training pass waits for the pass, and does not wake the engines meanwhile;
- a training pass waits for an in-flight sample only `training_wait_s`, then pauses it (abort), and the sample
  resumes after the pass with the tokens it had, so steady sampling cannot starve training.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from live_manager import LiveManager
from tx.inference.launch import LocalLauncher
from tx.inference.manager import EngineManager, EngineSettings
from tx.models.tiny import write_tiny_text_model
from tx.types import SamplingParams

MODEL = "tiny"
WAIT_S = 0.5
# Long enough that, unpaused, the training pass below would wait for it for seconds.
LONG = SamplingParams(max_tokens=2000, temperature=1.0, seed=3, stop_at_eos=False)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveManager]:
    model_dir = write_tiny_text_model(tmp_path_factory.mktemp("tiny-model"), preset="tiny", seed=0)
    launcher = LocalLauncher(tmp_path_factory.mktemp("engines"), "lease-test-secret-" + "x" * 16, device="cpu")
    settings = EngineSettings(count=1, colocate=True, training_wait_s=WAIT_S)  # the fake colocated device
    live = LiveManager(EngineManager({MODEL: model_dir}, settings, launcher), MODEL)
    live.sample("warmup")
    yield live
    live.close()


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
