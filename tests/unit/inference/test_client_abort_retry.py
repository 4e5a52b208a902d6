"""InferenceClient against a real embedded engine process (abort-retry, pickling, the secret), and the Router.

The abort test pauses the engine with mode `abort` while a long greedy generation runs: the engine answers
the partial sequence (stop reason `abort`), the client resends prompt + partial tokens, the resend waits in
the engine's queue until `/resume`, and the caller receives one whole answer equal to an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
import time
from collections import Counter

import httpx
import pytest
from live_engine import SECRET, EmbeddedEngine

from tx.inference.manager.client import EngineRequestError, EngineUnavailable, InferenceClient
from tx.inference.manager.router import Router
from tx.inference.protocol import SECRET_HEADER, GenerateRequest

PROMPT = [5, 17, 230, 1000, 44]
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    with EmbeddedEngine(tiny_model_dir, tmp_path_factory.mktemp("engine"), log_level="warning") as live:
        yield live


def _request(max_tokens: int = MAX_TOKENS, **overrides) -> GenerateRequest:
    body = dict(prompt_token_ids=PROMPT, max_tokens=max_tokens, temperature=0.0, stop_at_eos=False)
    return GenerateRequest(**{**body, **overrides})


def _generate(client: InferenceClient, request: GenerateRequest, key: str = "s:0"):
    async def run():
        try:
            return await client.generate("e0", key, request)
        finally:
            await client.aclose()

    return asyncio.run(run())


def _wait_for_steps(engine: EmbeddedEngine, start: int, at_least: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.health()["stats"]["num_decode_steps"] - start < at_least:
        assert time.monotonic() < deadline, "the engine made no progress"
        time.sleep(0.005)


@pytest.fixture(scope="module")
def uninterrupted(engine):
    answer = _generate(InferenceClient(engines={"e0": engine.url}, secret=SECRET), _request())
    (seq,) = answer.sequences
    assert seq.stop_reason == "length" and len(seq.token_ids) == MAX_TOKENS
    return seq


@pytest.mark.parametrize("pauses", [1, 2])
def test_abort_pause_is_retried_into_one_complete_sequence(engine, uninterrupted, pauses):
    client = InferenceClient(engines={"e0": engine.url}, secret=SECRET)
    before = engine.health()["stats"]
    result: dict = {}

    def run() -> None:
        try:
            result["answer"] = _generate(client, _request())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    steps = before["num_decode_steps"]
    for i in range(pauses):
        # mid-generation: after some steps, well before MAX_TOKENS
        _wait_for_steps(engine, steps, at_least=40)
        assert engine.post("/pause", {"mode": "abort"})["paused"] is True
        # the client resends at once; the resend waits in the engine's queue until resume
        deadline = time.monotonic() + 30
        while engine.health()["stats"]["num_requests"] - before["num_requests"] < 2 + i:
            assert time.monotonic() < deadline, "the client did not resend the aborted request"
            time.sleep(0.01)
        time.sleep(0.1)
        assert engine.health()["stats"]["num_requests"] - before["num_requests"] == 2 + i, "one resend per abort"
        assert engine.http.get("/health").json()["num_waiting"] == 1
        steps = engine.health()["stats"]["num_decode_steps"]
        assert engine.post("/resume")["paused"] is False
    thread.join(timeout=120)
    assert not thread.is_alive()
    if "error" in result:
        raise result["error"]

    answer = result["answer"]
    assert len(answer.sequences) == 1
    (seq,) = answer.sequences
    assert seq.stop_reason == "length"
    assert len(seq.token_ids) == MAX_TOKENS == len(seq.logprobs)
    assert seq.token_ids == uninterrupted.token_ids
    assert seq.logprobs == pytest.approx(uninterrupted.logprobs, abs=1e-4)
    after = engine.health()["stats"]
    assert after["num_requests"] - before["num_requests"] == 1 + pauses
    assert after["num_generated_tokens"] - before["num_generated_tokens"] == MAX_TOKENS


def test_pickled_client_works(engine, uninterrupted):
    client = InferenceClient(engines={"e0": engine.url}, secret=SECRET, timeout_s=123.0)

    async def run():
        first = await client.generate("e0", "s:1", _request(max_tokens=16))
        assert client._http is not None  # a live connection pool must not travel
        copy = pickle.loads(pickle.dumps(client))
        assert copy._http is None
        assert (copy.engines, copy.secret, copy.timeout_s) == (client.engines, client.secret, 123.0)
        second = await copy.generate("e0", "s:1", _request(max_tokens=16))
        await client.aclose()
        await copy.aclose()
        return first, second

    first, second = asyncio.run(run())
    assert first.sequences[0].token_ids == second.sequences[0].token_ids == uninterrupted.token_ids[:16]


def test_wrong_secret_is_a_clear_error(engine):
    client = InferenceClient(engines={"e0": engine.url}, secret="not-the-secret")
    with pytest.raises(EngineRequestError) as info:
        _generate(client, _request(max_tokens=4))
    assert info.value.status == 401 and info.value.name == "e0"
    assert SECRET_HEADER in str(info.value)


def test_unreachable_engine_is_engine_unavailable():
    client = InferenceClient(engines={"e0": "http://127.0.0.1:9"}, secret=SECRET, timeout_s=5)
    with pytest.raises(EngineUnavailable, match="e0"):
        _generate(client, _request(max_tokens=4))


def test_resumed_sample_stops_on_a_string_that_starts_before_the_abort(engine, uninterrupted):
    """A resend whose prompt ends with k earlier generated tokens: a stop string made of the last character
    of their text and the first character of the next token's text stops the sample at that next token."""
    decode = _tokenizer_decode(engine)
    tokens = uninterrupted.token_ids
    k = next(i for i in range(8, 60) if decode(tokens[:i]) and decode(tokens[i:i + 1])
             and decode(tokens[:i + 1]) == decode(tokens[:i]) + decode(tokens[i:i + 1]))
    stop = decode(tokens[:k])[-1] + decode(tokens[k:k + 1])[0]
    client = InferenceClient(engines={"e0": engine.url}, secret=SECRET)
    resend = _request(max_tokens=20, prompt_token_ids=PROMPT + tokens[:k], stop_strings=[stop])
    plain = _generate(client, resend).sequences[0]
    assert not (plain.stop_reason == "stop" and len(plain.token_ids) == 1)  # the new text alone has no match
    client = InferenceClient(engines={"e0": engine.url}, secret=SECRET)
    resumed = _generate(client, resend.model_copy(update={"resumed_tokens": k})).sequences[0]
    assert resumed.stop_reason == "stop" and resumed.token_ids == tokens[k:k + 1]


def _tokenizer_decode(engine: EmbeddedEngine):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(engine.config.model_dir)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


# ---- the resend, against a scripted engine (no process): what the client sends after an abort


def test_resend_bodies_after_abort_keep_samples_apart():
    """n=2 seeded samples aborted after the same number of tokens: each resend continues its own prefix
    with its own seed (never another sample's), asks for the remaining tokens only, and no prompt logprobs."""
    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if len(sent) == 1:
            seqs = [{"token_ids": [7, 8], "logprobs": [-1.0, -2.0], "stop_reason": "abort"},
                    {"token_ids": [7, 9], "logprobs": [-1.0, -3.0], "stop_reason": "abort"}]
            return httpx.Response(200, json={"sequences": seqs, "prompt_logprobs": [None, -0.5]})
        n = body["max_tokens"]
        return httpx.Response(200, json={"sequences": [
            {"token_ids": [1] * n, "logprobs": [-0.1] * n, "stop_reason": "length"}]})

    client = InferenceClient(engines={"e0": "http://engine"}, secret=SECRET,
                             _http=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    request = _request(max_tokens=5, n=2, seed=100, temperature=1.0, prompt_logprobs=True)
    answer = _generate(client, request)

    assert [s.token_ids for s in answer.sequences] == [[7, 8, 1, 1, 1], [7, 9, 1, 1, 1]]
    assert all(s.stop_reason == "length" and len(s.logprobs) == 5 for s in answer.sequences)
    assert answer.prompt_logprobs == [None, -0.5]
    first, *resends = sent
    resends.sort(key=lambda r: r["prompt_token_ids"])  # sent concurrently
    assert [r["prompt_token_ids"] for r in resends] == [PROMPT + [7, 8], PROMPT + [7, 9]]
    assert all(r["n"] == 1 and r["max_tokens"] == 3 and not r["prompt_logprobs"] for r in resends)
    assert all(r["resumed_tokens"] == 2 for r in resends)  # stop strings may start in [7, 8] / [7, 9]
    seeds = [r["seed"] for r in resends]
    original = {first["seed"] + i for i in range(first["n"])}
    assert len(set(seeds)) == 2 and not set(seeds) & original


# ---- Router


def test_router_order_is_stable_and_complete():
    engines = ["a", "b", "c", "d"]
    router = Router(engines)
    again = Router(list(reversed(engines)))  # the order given does not matter
    for i in range(200):
        key = f"session-{i}:{i % 7}"
        order = router.order(key)
        assert sorted(order) == engines
        assert order == router.order(key) == again.order(key)
        assert router.pick(key) == order[0]


def test_router_skips_dead_engines():
    router = Router(["a", "b", "c"])
    for i in range(100):
        key = f"k{i}"
        order = router.order(key)
        assert router.pick(key, alive=order[1:]) == order[1]
        assert router.pick(key, alive=[order[2]]) == order[2]
    with pytest.raises(LookupError):
        router.pick("k", alive=[])
    with pytest.raises(ValueError):
        Router([])


def test_router_spreads_keys_over_engines():
    engines = [f"e{i}" for i in range(4)]
    router = Router(engines)
    counts = Counter(router.pick(f"sampler-{i}") for i in range(4000))
    assert set(counts) == set(engines)
    assert min(counts.values()) > 0.5 * 4000 / len(engines), counts  # no engine starved
    assert max(counts.values()) < 1.6 * 4000 / len(engines), counts  # none overloaded


def test_removing_an_engine_moves_only_its_keys():
    full = Router(["e0", "e1", "e2", "e3"])
    smaller = Router(["e0", "e1", "e3"])
    moved = 0
    for i in range(2000):
        key = f"sampler-{i}"
        home = full.pick(key)
        if home == "e2":
            moved += 1
            assert smaller.pick(key) == full.pick(key, alive=["e0", "e1", "e3"]) != "e2"
        else:
            assert smaller.pick(key) == home, key
    assert moved > 0
