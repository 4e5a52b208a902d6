"""The RL toy task: reward = share of sampled tokens in a fixed 5% of the vocabulary.

Only a working weight sync can learn it: the sampler must sample from the weights just trained. The reward
stays near 0.05 for a while, then rises to ~1.0 within 3-4 steps; the step (from 0) where it first reaches 0.3
varies with the samples drawn: 8-15 over 9 runs on each backend here (mean 10.3 with JAX, 10.6 with torch),
and 19 in one CI run, too late for 20 steps. 30 steps leave room for that tail.

A run stops once the task is learned (3 steps in a row at a reward of 0.9 or more), as a user would stop it.
Past that point every sample of a group earns the same reward, so advantages and gradients are zero, and AdamW's
momentum alone moves the policy; one stray token then takes a step against the single mode the policy has
collapsed to, at a learning rate of 2e-2. On an H100 (bfloat16 base, engines colocated) that once knocked the
reward from 1.0 to 0.0 at step 24 of 30, where it stays (all rewards equal, so nothing to learn from), while the
sampler's logprobs stayed within 0.03 of the trainer's throughout: the toy's own dynamics, not a stale sampler.
"""

from __future__ import annotations

import numpy as np
import tinker
from tinker import types

VOCAB = 2000  # regular tokens of the tiny tokenizer
GOOD_TOKENS = frozenset(range(0, VOCAB, 20))
LEARNED = 0.9  # a mean reward this high, LEARNED_STEPS steps in a row, ends the run
LEARNED_STEPS = 3


def run_rl_toy(client: tinker.ServiceClient, base_model: str, steps: int = 30, lr: float = 2e-2,
               group: int = 16, max_tokens: int = 8, loss_fn: str = "importance_sampling") -> list[float]:
    """Mean reward per step of RL with LoRA rank 8, up to `steps` steps or until learned (`stable_reinforce`:
    samples recorded, datums with provenance, as the cookbook does)."""
    tc = client.create_lora_training_client(base_model, rank=8, seed=0).result()
    prompt = [11, 12, 13, 14]
    mean_rewards = []
    recorded = loss_fn == "stable_reinforce"
    for _ in range(steps):
        sampler = tc.save_weights_and_get_sampling_client(record_stability_info=recorded).result()
        result = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=group,
                                sampling_params=types.SamplingParams(max_tokens=max_tokens, temperature=1.0)).result()
        rewards = np.array([np.mean([t in GOOD_TOKENS for t in s.tokens]) for s in result.sequences])
        mean_rewards.append(float(rewards.mean()))
        advantages = rewards - rewards.mean()
        data = [_datum(prompt, list(seq.tokens), list(seq.logprobs), float(adv))
                for seq, adv in zip(result.sequences, advantages)]
        if recorded:
            data = [_with_provenance(d, len(prompt), len(seq.tokens), seq.sequence_id)
                    for d, seq in zip(data, result.sequences)]
        tc.forward_backward(data, loss_fn).result()
        tc.optim_step(types.AdamParams(learning_rate=lr)).result()
        if len(mean_rewards) >= LEARNED_STEPS and min(mean_rewards[-LEARNED_STEPS:]) >= LEARNED:
            break
    return mean_rewards


def _datum(prompt: list[int], tokens: list[int], logprobs: list[float], advantage: float) -> types.Datum:
    full = prompt + tokens
    n_prompt = len(prompt) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={
            "target_tokens": full[1:],
            "logprobs": [0.0] * n_prompt + logprobs,
            "advantages": [0.0] * n_prompt + [advantage] * len(tokens),
        },
    )


def _with_provenance(datum: types.Datum, prompt: int, sampled: int, sequence_id: str) -> types.Datum:
    return datum.with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id=sequence_id, length=prompt),
                     types.SampledProvenanceSpan(sequence_id=sequence_id, length=sampled - 1)],
        loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=sequence_id, offset=1, length=prompt - 1),
                        types.SampledProvenanceSpan(sequence_id=sequence_id, length=sampled)],
    )


def assert_reward_rose(mean_rewards: list[float]) -> None:
    start, end = np.mean(mean_rewards[:3]), np.mean(mean_rewards[-5:])
    assert end >= 3 * start and end >= 0.3, mean_rewards
