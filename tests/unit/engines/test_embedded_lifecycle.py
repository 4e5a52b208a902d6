"""The embedded engine's lifecycle over HTTP: pause (abort, wait, keep) and resume, queued requests."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import engine_reference as reference

PROMPT = [5, 17, 230, 1000, 44]
LONG = dict(prompt_token_ids=PROMPT, temperature=0.0, stop_at_eos=False)


def _wait_for_steps(engine, at_least: int, timeout_s: float = 30.0) -> None:
    """Block until the engine ran `at_least` more decode steps (so a request is in flight)."""
    start = engine.health()["stats"]["num_decode_steps"]
    deadline = time.monotonic() + timeout_s
    while engine.health()["stats"]["num_decode_steps"] - start < at_least:
        assert time.monotonic() < deadline, "the engine made no progress"
        time.sleep(0.01)


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as pool:
        yield pool


def test_pause_abort_returns_partial_then_resume(engine, reference_model, pool):
    running = pool.submit(engine.generate, **LONG, max_tokens=1800)
    _wait_for_steps(engine, 20)
    state = engine.post("/pause", {"mode": "abort"})
    assert state["paused"] is True
    seq = running.result(timeout=30)["sequences"][0]
    assert seq["stop_reason"] == "abort"
    assert 0 < len(seq["token_ids"]) < 1800 and len(seq["logprobs"]) == len(seq["token_ids"])
    reference.assert_raw_logprobs(reference_model, PROMPT, seq)
    queued = pool.submit(engine.generate, **LONG, max_tokens=4)
    time.sleep(0.5)
    assert not queued.done(), "a request sent during a pause must wait for resume"
    assert engine.health()["num_waiting"] == 1
    assert engine.post("/resume")["paused"] is False
    assert queued.result(timeout=30)["sequences"][0]["stop_reason"] == "length"


def test_pause_wait_lets_requests_finish(engine, pool):
    running = pool.submit(engine.generate, **LONG, max_tokens=200)
    _wait_for_steps(engine, 5)
    engine.post("/pause", {"mode": "wait"})
    health = engine.health()  # pause(wait) returns once in-flight requests finished
    assert health["paused"] and health["num_running"] == 0
    seq = running.result(timeout=10)["sequences"][0]
    assert seq["stop_reason"] == "length" and len(seq["token_ids"]) == 200
    engine.post("/resume")


def test_pause_keep_freezes_then_continues(engine, pool):
    expected = engine.generate(**LONG, max_tokens=400)["sequences"][0]
    running = pool.submit(engine.generate, **LONG, max_tokens=400)
    _wait_for_steps(engine, 20)
    engine.post("/pause", {"mode": "keep"})
    frozen_at = engine.health()["stats"]["num_decode_steps"]
    time.sleep(0.4)
    health = engine.health()
    assert health["stats"]["num_decode_steps"] == frozen_at and health["num_running"] == 1
    assert not running.done()
    engine.post("/resume")
    seq = running.result(timeout=60)["sequences"][0]
    assert seq["stop_reason"] == "length"
    assert seq["token_ids"] == expected["token_ids"]
    assert seq["logprobs"] == pytest.approx(expected["logprobs"], abs=1e-5)
