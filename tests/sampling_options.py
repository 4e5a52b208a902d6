"""Checks of the sampling options of SDK 0.38 against the trainer, shared by the embedded engine's tests
(tests/integration/test_sampling_options.py) and vLLM's (tests/vllm_engine/test_serve_vllm.py)."""

from __future__ import annotations

import numpy as np
import tinker
from tinker import types

BOUND = 1e-3  # float32 engine against float32 trainer: the bound docs/engines.md gives prompt logprobs


def trainer_logprobs(tc: tinker.TrainingClient, tokens: list[int], ids: np.ndarray) -> np.ndarray:
    """The trainer's logprobs of `ids` [len(tokens) - 1, K] (row i at position i + 1) after `tokens`."""
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
        "target_tokens": types.TensorData.from_numpy(ids.astype(np.int64)),
        "weights": types.TensorData.from_numpy(np.ones(ids.shape, np.float32))})
    out = tc.forward([datum], "cross_entropy").result()
    return out.loss_fn_outputs[0]["logprobs"].to_numpy().reshape(ids.shape)


def assert_options_match_the_trainer(tc: tinker.TrainingClient, sampler: tinker.SamplingClient,
                                     prompt: list[int]) -> None:
    """topk_sample_logprobs, target_prompt_logprobs (dense) and prompt_alt_tokens_k in one greedy sample of `prompt`,
    each against the trainer's logprobs of the same ids (and target against prompt_logprobs)."""
    rows = len(prompt) - 1
    ids = np.stack([np.array(prompt[1:]), np.full(rows, 5), np.full(rows, 7)], axis=1)
    ids[:3] = -1  # rows before the first named id are not scored
    ids[5, 2] = -1
    answer = sampler.sample(
        types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=6, temperature=0.0, stop=[]),
        include_prompt_logprobs=True, topk_sample_logprobs=4,
        target_prompt_logprobs=types.TensorData.from_numpy(ids), prompt_alt_tokens_k=3,
    ).result()
    target = answer.target_prompt_logprobs.to_numpy()
    assert target.shape == (rows, 3) and (target[:3] == 0).all() and target[5, 2] == 0
    np.testing.assert_allclose(target[3:, 0], np.array(answer.prompt_logprobs[4:], np.float32), atol=1e-6)
    named = ids >= 0
    theirs = trainer_logprobs(tc, prompt, np.where(named, ids, 0))
    np.testing.assert_allclose(target[named], theirs[named], atol=BOUND)

    [sequence] = answer.sequences
    top = sequence.topk_logprobs_np
    assert top.token_ids.shape == (6, 4) and (np.diff(top.logprobs, axis=1) <= 0).all()
    assert top.token_ids[:, 0].tolist() == sequence.tokens  # greedy: the best token is the one sampled
    np.testing.assert_allclose(top.logprobs[:, 0], sequence.logprobs, atol=1e-6)
    full = prompt + sequence.tokens
    generated = np.zeros((len(full) - 1, 4), np.int64)
    generated[len(prompt) - 1:] = top.token_ids
    np.testing.assert_allclose(top.logprobs, trainer_logprobs(tc, full, generated)[len(prompt) - 1:],
                               atol=BOUND)

    alt = answer.prompt_alt_tokens
    alt_tokens, alt_logprobs = alt.tokens.to_numpy(), alt.logprobs.to_numpy()
    assert alt_tokens.shape == alt_logprobs.shape == (rows, 3)
    assert (alt_tokens == alt_tokens[:, :1]).all()  # temperature 0: every draw is the argmax
    np.testing.assert_allclose(alt_logprobs, trainer_logprobs(tc, prompt, alt_tokens), atol=BOUND)


def sampled_in_full(seq: types.SampledSequence, max_tokens: int) -> bool:
    """A sequence drawn at temperature > 0 ran to `max_tokens`, or ended earlier on a stop token (the tokenizer's
    end token may be drawn, even by an untrained model)."""
    return (seq.stop_reason, len(seq.tokens)) == ("length", max_tokens) or (
        seq.stop_reason == "stop" and 0 < len(seq.tokens) <= max_tokens)
