"""Continuous batching in the embedded engine over HTTP: requests join a batch that is decoding, rows leave as they
finish, rows of different adapters share a forward, and every row's logprobs stay the model's own."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import engine_reference as reference
from engine_weights import gloo_sender, push, random_adapter

from tx.inference.protocol import GenerateResponse

PROMPTS = [[5, 17, 230, 1000, 44], [100, 200, 300], [7] * 12, [1500, 3, 900, 12, 8, 64, 2000]]
TARGETS = ["q_proj", "v_proj", "down_proj"]
LORA = {"r": 4, "lora_alpha": 8, "target_modules": TARGETS}


def _stats(engine) -> dict:
    return engine.health()["stats"]


def _wait_for_steps(engine, at_least: int, timeout_s: float = 60.0) -> None:
    start = _stats(engine)["num_decode_steps"]
    deadline = time.monotonic() + timeout_s
    while _stats(engine)["num_decode_steps"] - start < at_least:
        assert time.monotonic() < deadline, "the engine made no progress"
        time.sleep(0.01)


@pytest.fixture
def pool():
    with ThreadPoolExecutor(8) as pool:
        yield pool


def test_requests_join_a_running_batch_and_leave_as_they_finish(engine, reference_model, pool):
    before = _stats(engine)
    long_body = dict(prompt_token_ids=PROMPTS[0], max_tokens=1200, temperature=0.0, stop_at_eos=False)
    long = pool.submit(engine.generate, **long_body)
    _wait_for_steps(engine, 10)
    shorts = [
        pool.submit(engine.generate, prompt_token_ids=prompt, max_tokens=tokens, temperature=temperature, seed=3,
                    n=n, stop_at_eos=False)
        for prompt, tokens, temperature, n in zip(PROMPTS[1:], (8, 16, 24), (0.0, 1.0, 0.7), (1, 2, 3))
    ]
    answers = [short.result(timeout=120) for short in shorts]
    assert not long.done(), "the short requests joined the long one's batch and left it before it ended"
    after = _stats(engine)
    assert after["num_joins"] - before["num_joins"] >= 1
    assert after["max_rows_per_step"] >= 3
    for prompt, tokens, answer in zip(PROMPTS[1:], (8, 16, 24), answers):
        for seq in answer["sequences"]:
            assert len(seq["token_ids"]) == tokens and seq["stop_reason"] == "length"
            reference.assert_raw_logprobs(reference_model, prompt, seq)
    seq = long.result(timeout=300)["sequences"][0]
    assert len(seq["token_ids"]) == 1200
    expected = reference.greedy(reference_model, PROMPTS[0], 64)
    assert seq["token_ids"][: len(expected)] == expected, "rows joining and leaving left the long row unchanged"
    reference.assert_raw_logprobs(reference_model, PROMPTS[0], seq)


def test_a_joined_request_matches_the_same_request_alone(engine, pool):
    body = dict(prompt_token_ids=PROMPTS[3], max_tokens=40, temperature=0.9, seed=21, n=2, stop_at_eos=False)
    alone = engine.generate(**body)
    long = pool.submit(engine.generate, prompt_token_ids=PROMPTS[2], max_tokens=800, temperature=0.0,
                       stop_at_eos=False)
    _wait_for_steps(engine, 5)
    joined = engine.generate(**body)
    assert not long.done()
    assert [s["token_ids"] for s in joined["sequences"]] == [s["token_ids"] for s in alone["sequences"]]
    for a, b in zip(alone["sequences"], joined["sequences"]):
        assert b["logprobs"] == pytest.approx(a["logprobs"], abs=1e-4)
    long.result(timeout=300)


def test_rows_of_different_adapters_share_a_batch(engine, reference_model, pool):
    senders = gloo_sender(engine)
    sender = next(senders)
    try:
        models = {}
        for name, seed in (("m1", 1), ("m2", 2)):
            model, named = random_adapter(reference_model, seed, r=4, lora_alpha=8, targets=TARGETS)
            push(engine, sender, named, adapter=name, lora=LORA)
            models[name] = model
    finally:
        next(senders, None)
    before = _stats(engine)
    long = pool.submit(engine.generate, prompt_token_ids=PROMPTS[0], max_tokens=900, temperature=0.0,
                       stop_at_eos=False, adapter="m1")
    _wait_for_steps(engine, 5)
    bodies = [dict(prompt_token_ids=prompt, max_tokens=20, temperature=t, seed=7, stop_at_eos=False, adapter=a)
              for prompt, a, t in zip(PROMPTS[1:], ("m2", None, "m1"), (0.0, 0.8, 1.0))]
    answers = list(pool.map(lambda body: engine.generate(**body), bodies))
    assert not long.done()
    after = _stats(engine)
    assert after["max_adapters_per_step"] >= 2, "rows of different adapters shared a forward"
    assert after["num_joins"] > before["num_joins"]
    for body, answer in zip(bodies, answers):
        model = models.get(body["adapter"], reference_model)
        reference.assert_raw_logprobs(model, body["prompt_token_ids"], answer["sequences"][0])
    seq = long.result(timeout=300)["sequences"][0]
    reference.assert_raw_logprobs(models["m1"], PROMPTS[0], seq)
    alone = engine.generate(prompt_token_ids=PROMPTS[1], max_tokens=20, temperature=0.0, stop_at_eos=False,
                            adapter="m2")
    assert alone["sequences"][0]["token_ids"] == answers[0]["sequences"][0]["token_ids"]


def test_the_stream_route_sends_tokens_as_they_are_generated(engine, reference_model):
    import json

    body = dict(prompt_token_ids=PROMPTS[0], max_tokens=300, n=2, temperature=1.0, seed=5, stop_at_eos=False)
    events, steps_at_first = [], None
    with engine.http.stream("POST", "/generate/stream", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line:
                continue
            events.append(json.loads(line))
            if steps_at_first is None and events[-1].get("deltas"):
                steps_at_first = engine.health()["num_running"]
    assert steps_at_first == 1, "the first tokens arrived while the request was still generating"
    result = events[-1]["result"]
    assert all("result" not in event for event in events[:-1]) and len(events) > 2
    for index, seq in enumerate(result["sequences"]):
        streamed = [t for e in events[:-1] for d in e["deltas"] if d["index"] == index for t in d["token_ids"]]
        assert streamed == seq["token_ids"] and len(streamed) == 300
        reference.assert_raw_logprobs(reference_model, PROMPTS[0], seq)
    generated = GenerateResponse.model_validate(engine.generate(**body))  # a line leaves out default fields
    assert GenerateResponse.model_validate(result).sequences == generated.sequences, "the same answer as /generate"
    bad = engine.http.post("/generate/stream", json={"prompt_token_ids": [10**6]})
    assert bad.status_code == 400 and "vocabulary" in bad.json()["detail"]


def test_a_closed_stream_aborts_its_request(engine):
    """The contract's one way to cancel: a caller that closes the stream route stops its request; its rows leave
    the batch (num_cancelled counts it), far before its 2,000 tokens."""
    before = _stats(engine)
    body = dict(prompt_token_ids=PROMPTS[0], max_tokens=2000, temperature=0.0, stop_at_eos=False)
    with engine.http.stream("POST", "/generate/stream", json=body) as response:
        assert response.status_code == 200
        next(line for line in response.iter_lines() if line)  # the first tokens: the caller goes away
    deadline = time.monotonic() + 60
    while _stats(engine)["num_cancelled"] == before["num_cancelled"]:
        assert time.monotonic() < deadline, "the engine did not cancel the closed stream's request"
        time.sleep(0.01)
    health = engine.health()
    assert health["num_running"] == 0 and health["num_waiting"] == 0
    assert health["stats"]["num_cancelled"] == before["num_cancelled"] + 1
    assert health["stats"]["num_generated_tokens"] - before["num_generated_tokens"] < 2000
