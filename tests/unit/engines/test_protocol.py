"""The engine contract's models: conversions to and from the domain types, validation."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from tx.inference.manager.samples import generate_request, sample_result
from tx.inference.protocol import GenerateRequest, GenerateResponse, WeightsUpdateRequest
from tx.types import ModelInput, SampleRequest, SamplingParams, StopReason


def test_from_sample_request_carries_every_field():
    params = SamplingParams(
        max_tokens=5, temperature=0.5, top_p=0.9, top_k=7, seed=3, stop_token_ids=(9,), stop_strings=("\n",),
        stop_at_eos=False,
    )
    request = SampleRequest(
        ModelInput.from_tokens([1, 2, 3]), num_samples=4, params=params, prompt_logprobs=True,
        topk_prompt_logprobs=2, prompt_logprobs_last_n=1,
    )
    wire = generate_request(request, adapter="run-1", cache_namespace="ab12")
    assert wire.model_dump() == {
        "prompt_token_ids": [1, 2, 3], "images": [], "audio": [], "n": 4, "max_tokens": 5, "temperature": 0.5,
        "top_p": 0.9, "top_k": 7,
        "seed": 3, "stop_token_ids": [9], "stop_strings": ["\n"], "stop_at_eos": False, "resumed_tokens": 0,
        "prompt_logprobs": True, "topk_prompt_logprobs": 2, "prompt_logprobs_last_n": 1, "topk_sample_logprobs": 0,
        "target_token_ids": None, "prompt_alt_tokens_k": 0, "adapter": "run-1", "cache_namespace": "ab12",
    }


def test_to_sample_result():
    response = GenerateResponse.model_validate({
        "sequences": [{"token_ids": [4, 5], "logprobs": [-1.0, -2.0], "stop_reason": "stop"}],
        "prompt_logprobs": [None, -0.5],
        "topk_prompt_logprobs": [None, [[3, -0.1], [4, -0.5]]],
    })
    result = sample_result(response)
    assert result.sequences[0].stop_reason is StopReason.STOP and result.sequences[0].tokens == [4, 5]
    assert math.isnan(result.prompt_logprobs[0]) and result.prompt_logprobs[1] == -0.5
    ids, logprobs = result.topk_prompt_logprobs
    assert ids.tolist() == [[-1, -1], [3, 4]] and math.isnan(logprobs[0, 0]) and logprobs[1, 1] == -0.5
    aborted = response.model_copy(update={"sequences": [response.sequences[0].model_copy(
        update={"stop_reason": "abort"})]})
    with pytest.raises(ValueError, match="aborted"):
        sample_result(aborted)


def test_prompt_scores_land_in_their_own_fields():
    """Regression: after weights_version joined SampleResult, the scores went by position into the wrong fields."""
    response = GenerateResponse.model_validate({
        "sequences": [{"token_ids": [4], "logprobs": [-1.0], "stop_reason": "length",
                       "topk_logprobs": [[[4, -1.0], [6, -2.0]]]}],
        "target_prompt_logprobs": [[-0.25, 0.0]],
        "prompt_alt_tokens": [[7, 8]], "prompt_alt_logprobs": [[-0.5, -1.5]],
    })
    result = sample_result(response)
    assert result.weights_version is None
    assert result.target_prompt_logprobs is not None and result.target_prompt_logprobs.values.tolist() == [[-0.25, 0.0]]
    assert result.prompt_alt_tokens is not None
    tokens, logprobs = result.prompt_alt_tokens
    assert tokens.tolist() == [[7, 8]] and logprobs.tolist() == [[-0.5, -1.5]]
    topk = result.sequences[0].topk
    assert topk is not None and topk[0].tolist() == [[4, 6]]


def test_validation():
    with pytest.raises(ValidationError):
        GenerateRequest(prompt_token_ids=[1], n=0)
    with pytest.raises(ValidationError):
        GenerateRequest(prompt_token_ids=[])
    transfer = {"tensors": [], "bucket_bytes": 1}
    with pytest.raises(ValidationError, match="adapter"):
        WeightsUpdateRequest.model_validate({"transfer": transfer, "adapter": "a"})
    WeightsUpdateRequest.model_validate({"transfer": transfer})
