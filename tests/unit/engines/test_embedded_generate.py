"""The embedded engine over HTTP: generation, logprobs, stops, batching, validation, the secret."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import engine_reference as reference
import httpx
import pytest

PROMPTS = [[5, 17, 230, 1000, 44], [100, 200, 300], [7] * 12, [1500, 3, 900, 12, 8, 64, 2000]]


def test_greedy_matches_hf_generate(engine, reference_model):
    for prompt in PROMPTS[:2]:
        out = engine.generate(prompt_token_ids=prompt, max_tokens=24, temperature=0.0)
        expected = reference.greedy(reference_model, prompt, 24)
        assert out["sequences"][0]["token_ids"] == expected


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, -1, 1.0), (0.7, 50, 0.9), (1.5, -1, 1.0)])
def test_sampled_logprobs_are_raw(engine, reference_model, temperature, top_k, top_p):
    prompt = PROMPTS[0]
    out = engine.generate(
        prompt_token_ids=prompt, max_tokens=12, n=2, seed=3, stop_at_eos=False,
        temperature=temperature, top_k=top_k, top_p=top_p,
    )
    for seq in out["sequences"]:
        assert len(seq["token_ids"]) == len(seq["logprobs"]) == 12
        expected = reference.token_logprobs(reference_model, prompt, seq["token_ids"])
        assert seq["logprobs"] == pytest.approx(expected, abs=1e-4)


def test_prompt_logprobs_and_last_n(engine, reference_model):
    prompt = PROMPTS[3]
    expected = reference.prompt_logprobs(reference_model, prompt)
    full = engine.generate(
        prompt_token_ids=prompt, max_tokens=1, prompt_logprobs=True, topk_prompt_logprobs=3
    )
    assert full["prompt_logprobs"][0] is None
    assert full["prompt_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
    topk = full["topk_prompt_logprobs"]
    assert topk[0] is None and all(len(row) == 3 for row in topk[1:])
    for row, actual in zip(topk[1:], expected):
        assert row[0][1] >= row[1][1] >= row[2][1]
        assert row[0][1] >= actual - 1e-4
    last = engine.generate(
        prompt_token_ids=prompt, max_tokens=0, prompt_logprobs=True, prompt_logprobs_last_n=2
    )
    assert last["prompt_logprobs"][:-2] == [None] * (len(prompt) - 2)
    assert last["prompt_logprobs"][-2:] == pytest.approx(expected[-2:], abs=1e-4)
    assert last["sequences"][0] == {"token_ids": [], "logprobs": [], "stop_reason": "length", "topk_logprobs": None}


def test_seeded_samples_are_reproducible(engine):
    body = dict(prompt_token_ids=PROMPTS[1], max_tokens=10, n=3, seed=11, stop_at_eos=False)
    first, second = engine.generate(**body), engine.generate(**body)
    assert first == second
    tokens = [seq["token_ids"] for seq in first["sequences"]]
    assert len({tuple(t) for t in tokens}) > 1, "the n samples should differ from each other"
    other = engine.generate(**{**body, "seed": 12})
    assert [seq["token_ids"] for seq in other["sequences"]] != tokens


def test_stop_token_ids(engine):
    prompt = PROMPTS[0]
    free = engine.generate(prompt_token_ids=prompt, max_tokens=16, temperature=0.0, stop_at_eos=False)
    tokens = free["sequences"][0]["token_ids"]
    stop = tokens[5]
    out = engine.generate(prompt_token_ids=prompt, max_tokens=16, temperature=0.0, stop_at_eos=False,
                          stop_token_ids=[stop])
    seq = out["sequences"][0]
    assert seq["stop_reason"] == "stop"
    assert seq["token_ids"] == tokens[: tokens.index(stop) + 1]


def test_stop_strings(engine, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    prompt = engine.post("/tokenize", {"text": "The cat sat on the"})["token_ids"]
    assert prompt == tokenizer.encode("The cat sat on the", add_special_tokens=False)
    free = engine.generate(prompt_token_ids=prompt, max_tokens=16, temperature=0.0, stop_at_eos=False)
    tokens = free["sequences"][0]["token_ids"]
    stop = tokenizer.decode(tokens[3:5])[-3:]
    assert stop
    cut = next(i for i in range(1, len(tokens) + 1) if stop in tokenizer.decode(tokens[:i]))
    out = engine.generate(prompt_token_ids=prompt, max_tokens=16, temperature=0.0, stop_at_eos=False,
                          stop_strings=["zzzz-never", stop])
    assert out["sequences"][0]["stop_reason"] == "stop"
    assert out["sequences"][0]["token_ids"] == tokens[:cut]


def test_concurrent_requests_are_batched(engine, reference_model):
    before = engine.health()["stats"]
    prompts = PROMPTS * 2
    with ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(
            lambda p: engine.generate(prompt_token_ids=p, max_tokens=32, temperature=0.0, stop_at_eos=False),
            prompts,
        ))
    after = engine.health()["stats"]
    assert after["max_requests_per_batch"] > 1
    assert after["num_batches"] - before["num_batches"] < len(prompts)
    for prompt, out in zip(prompts, outs):
        tokens = out["sequences"][0]["token_ids"]
        assert len(tokens) == 32
        assert out["sequences"][0]["logprobs"] == pytest.approx(
            reference.token_logprobs(reference_model, prompt, tokens), abs=1e-4
        )
        expected = reference.greedy(reference_model, prompt, 32)
        assert tokens[: len(expected)] == expected


def test_bad_requests_get_4xx(engine):
    cases = [
        ({"prompt_token_ids": [10**6]}, 400),
        ({"prompt_token_ids": [-1]}, 400),
        ({"prompt_token_ids": [1], "stop_token_ids": [10**6]}, 400),
        ({"prompt_token_ids": [1], "adapter": "nope"}, 404),
        ({"prompt_token_ids": [1], "n": 0}, 422),
        ({"prompt_token_ids": []}, 422),
        ({"prompt_token_ids": [1], "max_tokens": 10**6}, 400),
        ({"prompt_token_ids": [1], "temperature": -1}, 422),
        ({"prompt_token_ids": [1], "unknown_field": 1}, 422),
    ]
    for body, status in cases:
        response = engine.http.post("/generate", json=body)
        assert response.status_code == status, (body, response.text)
        assert "detail" in response.json()
    assert engine.http.delete("/adapters/nope").status_code == 404
    assert engine.http.post("/pause", json={"mode": "later"}).status_code == 422


def test_secret_is_required(engine):
    assert httpx.get(engine.url + "/health").status_code == 200
    for headers in ({}, {"X-TX-Cluster-Secret": "wrong"}):
        for path in ("/generate", "/pause", "/resume", "/sleep", "/weights/finish", "/tokenize"):
            response = httpx.post(engine.url + path, json={"prompt_token_ids": [1]}, headers=headers)
            assert response.status_code == 401, (path, response.text)
    assert httpx.delete(engine.url + "/adapters/x").status_code == 401
