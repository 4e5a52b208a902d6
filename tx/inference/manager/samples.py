"""The engine client's edge: a domain `SampleRequest` becomes the contract's `GenerateRequest`, and the engine's
`GenerateResponse` a domain `SampleResult` (one sample object from the API's edge to here; docs/engines.md).
"""

from __future__ import annotations

import base64

import numpy as np

from tx.inference.protocol import GenerateRequest, GenerateResponse, PromptAudio, PromptImage
from tx.types import SampledSequence, SampleRequest, SampleResult, StopReason, TargetLogprobs

TopkRows = list[list[tuple[int, float]]] | list[list[tuple[int, float]] | None]


def generate_request(request: SampleRequest, adapter: str | None = None,
                     cache_namespace: str | None = None) -> GenerateRequest:
    """The engine request for a domain `SampleRequest` (in its own prefix-cache namespace if given). A prompt with
    images or audio must have been expanded (`SampleRequest.expanded`); without that, it must be text only."""
    params = request.params
    prompt = request.model_input()
    images = [
        PromptImage(data=base64.b64encode(p.data).decode("ascii"), format=p.format, offset=p.offset,
                    num_tokens=p.num_tokens)
        for p in prompt.images
    ]
    target = request.target_prompt_logprobs
    return GenerateRequest(
        prompt_token_ids=prompt.token_ids,
        images=images,
        audio=[PromptAudio.of(clip.levels, clip.offset) for clip in prompt.audio],
        n=request.num_samples,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=params.seed,
        stop_token_ids=list(params.stop_token_ids),
        stop_strings=list(params.stop_strings),
        stop_at_eos=params.stop_at_eos,
        prompt_logprobs=request.prompt_logprobs,
        topk_prompt_logprobs=request.topk_prompt_logprobs,
        prompt_logprobs_last_n=request.prompt_logprobs_last_n,
        topk_sample_logprobs=request.topk_sample_logprobs,
        target_token_ids=target.ids.tolist() if target is not None else None,
        prompt_alt_tokens_k=request.prompt_alt_tokens_k,
        adapter=adapter,
        cache_namespace=cache_namespace,
    )


def sample_result(response: GenerateResponse, request: SampleRequest | None = None) -> SampleResult:
    """The domain result of `request`; an aborted sequence raises ValueError (the caller retries or resends)."""
    if any(seq.stop_reason == "abort" for seq in response.sequences):
        raise ValueError("a sequence was aborted; resend it (tx/inference/manager/resume.py)")
    sequences = [
        SampledSequence(s.token_ids, s.logprobs, StopReason(s.stop_reason), topk_arrays(s.topk_logprobs))
        for s in response.sequences
    ]
    prompt = None
    if response.prompt_logprobs is not None:
        prompt = np.array([np.nan if v is None else v for v in response.prompt_logprobs], dtype=np.float32)
    target = None
    if response.target_prompt_logprobs is not None:
        asked = request.target_prompt_logprobs if request is not None else None
        target = TargetLogprobs(np.array(response.target_prompt_logprobs, dtype=np.float32).reshape(
            len(response.target_prompt_logprobs), -1), asked.csr if asked is not None else None)
    alt = None
    if response.prompt_alt_tokens is not None and response.prompt_alt_logprobs is not None:
        alt = np.array(response.prompt_alt_tokens, np.int64), np.array(response.prompt_alt_logprobs, np.float32)
    return SampleResult(sequences, prompt, topk_arrays(response.topk_prompt_logprobs),
                        target_prompt_logprobs=target, prompt_alt_tokens=alt)


def topk_arrays(rows: TopkRows | None) -> tuple[np.ndarray, np.ndarray] | None:
    """[len(rows), k] token ids (-1 where absent) and logprobs (NaN where absent)."""
    if rows is None:
        return None
    k = max((len(row) for row in rows if row is not None), default=0)
    ids = np.full((len(rows), k), -1, dtype=np.int64)
    logprobs = np.full((len(rows), k), np.nan, dtype=np.float32)
    for i, row in enumerate(rows):
        for j, (token, value) in enumerate(row or ()):
            ids[i, j], logprobs[i, j] = token, value
    return ids, logprobs
