"""Every sampling option of SDK 0.38 on the embedded engine, through the SDK: topk_sample_logprobs,
target_prompt_logprobs (dense and CSR), prompt_alt_tokens_k; their numbers against the trainer's (float32: within
1e-3, the bound docs/engines.md gives prompt logprobs); and the cookbook's decisions.sample_decision."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tinker
import torch
from conftest import Trained
from cookbook import cookbook_available
from sampling_options import BOUND, assert_options_match_the_trainer, trainer_logprobs
from tinker import types
from txserver import TxServer


@pytest.fixture(scope="module")
def sampler(trained: Trained) -> tinker.SamplingClient:
    return trained.tc.save_weights_and_get_sampling_client().result()


def test_topk_target_and_alternatives_match_the_trainer(trained: Trained, sampler: tinker.SamplingClient) -> None:
    assert_options_match_the_trainer(trained.tc, sampler, trained.tokens)


def test_sparse_targets_and_seeded_alternatives(trained: Trained, sampler: tinker.SamplingClient) -> None:
    prompt = trained.tokens
    ids = torch.full((len(prompt) - 1, 4), -1, dtype=torch.int64)
    ids[-1] = torch.tensor([11, 12, 13, 14])
    params = types.SamplingParams(max_tokens=1, temperature=1.0, seed=42)
    sparse = types.TensorData.from_torch_sparse(ids, pad_value=-1)
    answers = [sampler.sample(types.ModelInput.from_ints(prompt), 1, params, target_prompt_logprobs=sparse,
                              prompt_alt_tokens_k=8).result() for _ in range(2)]
    target = answers[0].target_prompt_logprobs
    assert target.sparse_crow_indices is not None  # answered in the request's layout
    dense = target.to_torch().to_dense().numpy()
    theirs = trainer_logprobs(trained.tc, prompt, np.where(ids.numpy() >= 0, ids.numpy(), 0))
    np.testing.assert_allclose(dense[-1], theirs[-1], atol=BOUND)
    assert (dense[:-1] == 0).all()
    first, second = (a.prompt_alt_tokens.tokens.to_numpy() for a in answers)
    assert (first == second).all() and len(np.unique(first)) > 1  # seeded: the same draws; at T=1, varied


def test_bad_options_are_refused(sampler: tinker.SamplingClient, trained: Trained) -> None:
    prompt = types.ModelInput.from_ints(trained.tokens)
    params = types.SamplingParams(max_tokens=1)
    for kwargs, message in [
        ({"target_prompt_logprobs": types.TensorData.from_numpy(np.full((3, 2), 5, np.int64))}, "rows"),
        ({"target_prompt_logprobs": types.TensorData.from_numpy(np.full((len(trained.tokens) - 1, 1), -1,
                                                                        np.int64))}, "names no token"),
        ({"topk_sample_logprobs": 5000}, "topk_sample_logprobs"),
    ]:
        with pytest.raises(tinker.BadRequestError, match=message):
            sampler.sample(prompt, 1, params, **kwargs).result()


@pytest.mark.skipif(not cookbook_available(), reason="tinker_cookbook is not installed")
def test_cookbook_sample_decision(server: TxServer, trained: Trained, sampler: tinker.SamplingClient) -> None:
    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.decisions import Decision, DecisionRenderer, sample_decision
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(server.data_dir / "models" / "tiny-qwen3"))
    rendering = DecisionRenderer(renderers.get_renderer("qwen3", tokenizer)).render(
        Decision("Which team answers questions about the SDK?", [("sdk", "the SDK"), ("docs", "the docs"),
                                                                  ("billing", "invoices")]))
    probabilities = asyncio.run(sample_decision(sampler, rendering))
    assert list(probabilities) == ["sdk", "docs", "billing"] and sum(probabilities.values()) == pytest.approx(1)
    ids = np.zeros((len(rendering.tokens) - 1, 3), np.int64)
    ids[rendering.choice_pos - 1] = [rendering.label_tokens[label] for label in probabilities]
    theirs = trainer_logprobs(trained.tc, rendering.tokens, ids)[rendering.choice_pos - 1]
    expected = torch.softmax(torch.tensor(theirs), dim=0).numpy()
    np.testing.assert_allclose(list(probabilities.values()), expected, atol=2e-3)
