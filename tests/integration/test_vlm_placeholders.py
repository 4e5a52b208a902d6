"""Issue 37 through the real SDK: an RL step on a vision-language model whose text holds image placeholder
tokens, on a tiny model of each VLM family (docs/model-families.md#image-placeholder-tokens-in-text).

In the cookbook's RL tutorials on Qwen3.5 the policy sampled `<|image_pad|>`, and tx refused its own sampler's
output: the next forward_backward ("text holds the image placeholder token") and the next sample's prompt. Now
a datum or a prompt without images may hold placeholders (text, as in Hugging Face's forward), the sampler's
logprobs of such a prompt are the trainer's, and tx's sampler never draws one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types

from txserver import TxServer

PRESETS = ("vlm", "qwen3_5_vl", "qwen3_5_moe_vl")
IM_START, IM_END = 2001, 2002


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[tinker.ServiceClient, dict[str, Path]]]:
    from tx.models.tiny_vlm import write_tiny_vlm

    root = tmp_path_factory.mktemp("vlm-placeholders")
    dirs = {preset: write_tiny_vlm(root / preset, seed=0, preset=preset) for preset in PRESETS}
    args = [arg for path in dirs.values() for arg in ("--base-model", str(path))] + ["--no-engine-colocate"]
    with TxServer(root / "data", args=args, env={"OMP_NUM_THREADS": "1"}) as server:
        with server.client() as client:
            yield client, dirs


def placeholders(model_dir: Path) -> tuple[int, int]:
    config = json.loads((model_dir / "config.json").read_text())
    return config["image_token_id"], config["video_token_id"]


@pytest.mark.parametrize("preset", PRESETS)
def test_an_rl_step_takes_placeholders_in_text(served, preset: str) -> None:
    client, dirs = served
    image, video = placeholders(dirs[preset])
    trainer = client.create_lora_training_client(str(dirs[preset]), rank=8, seed=0).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()

    # the policy's turn, then a completion holding the placeholders (as the tutorial's policy sampled them)
    prompt = [IM_START, 10, 11, IM_END, IM_START, image, 12]
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=5)
    samples = sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result().sequences
    assert all(len(s.tokens) >= 1 and not {image, video} & set(s.tokens) for s in samples)  # never sampled
    completion = [*samples[0].tokens, image, 13, image, image, video, 14]
    tokens = prompt + completion

    # the next sample's prompt holds them: the sampler's prompt logprobs ...
    prompt_logprobs = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(tokens)
    again = sampler.sample(types.ModelInput.from_ints(tokens), 1, params).result().sequences[0]
    assert len(again.tokens) >= 1

    # ... are the trainer's, in the forward_backward of an importance-sampling datum over the same tokens
    start = len(prompt) - 1  # the first completion token's target position
    weights = [0.0] * start + [1.0] * len(completion)
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
        "target_tokens": tokens[1:],
        "logprobs": [0.0] * start + list(prompt_logprobs[len(prompt):]),
        "advantages": weights,
    })
    out = trainer.forward_backward([datum], "importance_sampling").result()
    trained = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(trained, prompt_logprobs[1:], atol=1e-3)
    sampled = trained[start : start + len(samples[0].tokens)]
    np.testing.assert_allclose(samples[0].logprobs, sampled, atol=1e-3)
    trainer.optim_step(types.AdamParams(learning_rate=1e-3)).result()
