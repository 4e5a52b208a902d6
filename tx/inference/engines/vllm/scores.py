"""The prompt scores vLLM has no request field for, each from bodies of its own on the same `/v1/completions`:

- `target_token_ids`: one body per row that names ids (row i: the prompt's first i + 1 tokens, one token to
  generate), asking `logprob_token_ids` = that row's ids with `logprobs: 1`: vLLM gives the raw logprob of each
  of them at the next position (`logprob_token_ids` is vLLM 0.32's, the release tested here); prefix caching
  makes each body cost about one token of prefill;
- `prompt_alt_tokens_k`: one body per prompt position after the first (position p: the first p tokens), drawing
  k tokens (`n`) at the request's temperature with no top-k or top-p, `logprobs: 0` (raw); greedy asks for one
  and repeats it, as vLLM refuses n > 1 at temperature 0. Seeded requests seed position p's draws with
  seed + n + p.
Their answers fill `GenerateResponse.target_prompt_logprobs` and `prompt_alt_tokens` / `prompt_alt_logprobs`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tx.inference.engines.scores import check_prompt_scores, model_vocab_size
from tx.inference.engines.vllm.batch import all_or_none
from tx.inference.engines.vllm.translate import TranslationError, best_by_id
from tx.inference.protocol import GenerateRequest

Complete = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class PromptScores:
    """The engine's prompt scores for its model: `check` a request before it queues (a 400, never a failed batch),
    then `answer` it (the response fields, none asked: {})."""

    def __init__(self, model_dir: Path) -> None:
        self.vocab_size = model_vocab_size(model_dir)

    def check(self, request: GenerateRequest) -> None:
        check_prompt_scores(request, self.vocab_size)

    async def answer(self, request: GenerateRequest, model: str, complete: Complete) -> dict[str, Any]:
        return await prompt_scores(request, model, complete)


async def prompt_scores(request: GenerateRequest, model: str, complete: Complete) -> dict[str, Any]:
    """The response fields of the request's prompt scores (none asked: {})."""
    fields: dict[str, Any] = {}
    if request.target_token_ids is not None:
        fields["target_prompt_logprobs"] = await _targets(request, model, complete)
    if request.prompt_alt_tokens_k:
        fields["prompt_alt_tokens"], fields["prompt_alt_logprobs"] = await _alternatives(request, model, complete)
    return fields


def _body(request: GenerateRequest, model: str, prefix: int, **fields: Any) -> dict[str, Any]:
    body = {"model": model, "prompt": list(request.prompt_token_ids[:prefix]), "max_tokens": 1, "top_p": 1.0,
            "top_k": -1, "ignore_eos": True, "return_token_ids": True, "skip_special_tokens": False, **fields}
    if request.cache_namespace is not None:  # the request's own prefix-cache namespace (translate.py)
        body["cache_salt"] = request.cache_namespace
    return body


async def _targets(request: GenerateRequest, model: str, complete: Complete) -> list[list[float]]:
    assert request.target_token_ids is not None
    rows = request.target_token_ids
    out = [[0.0] * len(row) for row in rows]
    named = [(r, sorted({t for t in row if t >= 0})) for r, row in enumerate(rows) if any(t >= 0 for t in row)]
    answers = await all_or_none((
        complete(_body(request, model, r + 1, temperature=0.0, n=1, logprobs=1, logprob_token_ids=ids,
                       return_tokens_as_token_ids=True))
        for r, ids in named
    ))
    for (r, ids), answer in zip(named, answers):
        position = (answer["choices"][0].get("logprobs") or {}).get("top_logprobs") or [None]
        values = dict(best_by_id(position[0] or {}))
        missing = [t for t in ids if t not in values]
        if missing:
            raise TranslationError(f"vLLM gave no logprob for target ids {missing[:5]} at prompt position {r + 1}")
        out[r] = [values[t] if t >= 0 else 0.0 for t in rows[r]]
    return out


async def _alternatives(request: GenerateRequest, model: str,
                        complete: Complete) -> tuple[list[list[int]], list[list[float]]]:
    k, greedy = request.prompt_alt_tokens_k, request.temperature == 0
    positions = range(1, len(request.prompt_token_ids))
    answers = await all_or_none((
        complete(_body(request, model, p, temperature=request.temperature, n=1 if greedy else k, logprobs=0,
                       seed=None if request.seed is None else request.seed + request.n + p))
        for p in positions
    ))
    tokens, logprobs = [], []
    for answer in answers:
        draws = sorted(answer["choices"], key=lambda choice: choice["index"])
        ids = [int(choice["token_ids"][0]) for choice in draws]
        values = [float(choice["logprobs"]["token_logprobs"][0]) for choice in draws]
        tokens.append(ids * k if greedy else ids)
        logprobs.append(values * k if greedy else values)
    return tokens, logprobs
