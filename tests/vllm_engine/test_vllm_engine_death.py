"""No request left waiting on a real vLLM: when vLLM's engine core dies under requests in flight, every one of them
is answered with an error naming the cause, and tx's vLLM engine process exits so that tx's supervisor starts a new
one on the next request (docs/engines.md#the-vllm-engine).

Fault injection without a hook: the test SIGKILLs vLLM's engine core process (`VLLM::EngineCore`, a child of
vLLM's API server) while three requests generate. Its own engine: the fault ends it (a vLLM start is ~30 s of a
core on CPU).
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
from live_engine import VllmEngine

pytestmark = pytest.mark.vllm

ANSWERED_S = 30.0
"""Every request in flight is answered within this of the engine core's death."""


@pytest.fixture
def engine(dying_engine: VllmEngine) -> VllmEngine:
    """This test's own engine (tests/vllm_engine/conftest.py starts it beside test_vllm_engine.py's when both
    run): no LoRA, its client waiting ANSWERED_S * 4."""
    return dying_engine


def engine_core(engine_pid: int) -> psutil.Process:
    """vLLM's engine core process among the engine's descendants."""
    for process in psutil.Process(engine_pid).children(recursive=True):
        if "EngineCore" in process.name() or any("EngineCore" in part for part in process.cmdline()):
            return process
    raise AssertionError("no VLLM::EngineCore process under the engine")


def test_an_engine_core_that_dies_answers_every_request_in_flight(engine: VllmEngine):
    body = {"prompt_token_ids": [5, 17, 230], "max_tokens": 2000, "temperature": 1.0, "stop_at_eos": False}
    with ThreadPoolExecutor(3) as pool:
        calls = [pool.submit(engine.http.post, "/generate", json=body) for _ in range(3)]
        deadline = time.monotonic() + 60
        while engine.health()["num_running"] < 3:
            assert time.monotonic() < deadline, "the requests never reached vLLM"
            time.sleep(0.05)
        engine_core(engine.handle.pid).send_signal(signal.SIGKILL)
        killed = time.monotonic()
        answers = [call.result(timeout=ANSWERED_S * 2) for call in calls]
    assert time.monotonic() - killed < ANSWERED_S
    for answer in answers:  # vLLM answers 500 for each (its engine is dead), or its socket closes: a 502
        assert answer.status_code in (500, 502), answer.text
        assert "EngineCore" in answer.text or "vLLM did not answer" in answer.text, answer.text
    deadline = time.monotonic() + ANSWERED_S
    while engine.handle.alive:  # vLLM exits, and the engine with it: the supervisor starts a new one
        assert time.monotonic() < deadline, "the engine outlived its vLLM"
        time.sleep(0.2)
    with pytest.raises(httpx.TransportError):
        engine.health()
