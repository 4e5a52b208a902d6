"""The embedded engine's lean decode step (tx/inference/engines/embedded/lean_decode.py) gives bitwise the logits
of transformers' own forward on the dense Qwen3: rows of one LoRA adapter (float32, and a bfloat16 base under
float32 adapters), the base model, padded rows, rows that joined a running batch and rows left after others
finished; the whole running batch samples the same tokens and logprobs with it as without it. Models and
batches it does not cover take transformers' forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tx.inference.engines.embedded import lean_decode
from tx.inference.engines.embedded.batch import Job, RunningBatch
from tx.inference.engines.embedded.generate import DecodeBatch
from tx.inference.engines.embedded.weights import Weights
from tx.inference.protocol import EngineStats, GenerateRequest, LoraSpec

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = list(range(20, 36))


def _adapter_tensors(weights: Weights, seed: int) -> dict[str, torch.Tensor]:
    generator, tensors = torch.Generator().manual_seed(seed), {}
    model = weights.model
    assert model is not None
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in TARGETS and type(module) is torch.nn.Linear:
            tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(8, module.in_features,
                                                                           generator=generator) * 0.1
            tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(module.out_features, 8,
                                                                           generator=generator) * 0.1
    return tensors


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def weights(request, tiny_model_dir: Path) -> Weights:
    weights = Weights(tiny_model_dir, max_adapters=2, dtype=request.param)
    spec = LoraSpec(r=8, lora_alpha=24, target_modules=TARGETS)  # scaling 3: not a power of two
    weights.load_adapter("a", spec, _adapter_tensors(weights, 0))
    weights.load_adapter("b", spec, _adapter_tensors(weights, 1))
    return weights


def _steps(weights: Weights, adapter: str | None, prompts: list[list[int]], lean: bool,
           join: list[list[int]] | None = None, keep: list[int] | None = None) -> list[torch.Tensor]:
    """Logits of 6 decode steps (a join before the third, a row selection before the fifth)."""
    out = []
    with torch.inference_mode():
        model = weights.use([adapter])
        plan = weights.lean_plan(model) if lean else None
        assert not lean or plan is not None
        batch = DecodeBatch(weights.pad_id)
        batch.prefill(model, prompts, 1)
        for i in range(6):
            if i == 2 and join is not None:
                other = DecodeBatch(weights.pad_id)
                other.prefill(model, join, 1)
                batch.merge(other)
            if i == 4 and keep is not None:
                batch.select_rows(keep)
            out.append(batch.step(model, [100 + 7 * i + r for r in range(batch.num_rows)], plan))
    return out


@pytest.mark.parametrize("adapter", ["a", "b", None])
@pytest.mark.parametrize("shape", ["same prompts", "padded", "joined, then rows left"])
def test_the_lean_step_gives_transformers_logits_bitwise(weights, adapter, shape):
    prompts = [PROMPT] * 4 if shape == "same prompts" else [PROMPT, PROMPT[:5], PROMPT[3:9]]
    join = [PROMPT[2:], PROMPT[:11]] if shape.startswith("joined") else None
    keep = [1, 3] if join else None
    expected = _steps(weights, adapter, prompts, lean=False, join=join, keep=keep)
    got = _steps(weights, adapter, prompts, lean=True, join=join, keep=keep)
    for want, have in zip(expected, got, strict=True):
        assert have.dtype == want.dtype and torch.equal(have, want)
    if adapter == "a":  # the plan follows the active adapter
        assert not torch.equal(_steps(weights, "b", prompts, True, join, keep)[0], got[0])


def test_the_mask_is_transformers_mask_for_a_one_token_query(weights):
    from transformers.masking_utils import create_causal_mask

    model = lean_decode.causal_lm(weights.use(["a"]))
    for mask in (torch.ones(3, 9, dtype=torch.long), torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])):
        with torch.inference_mode():
            batch = DecodeBatch(weights.pad_id)
            prompts = [[5] * int(row.sum() - 1) for row in mask]
            batch.prefill(weights.use(["a"]), prompts, 1)
            cache = batch.cache
            assert cache is not None
            embeds = torch.zeros(mask.shape[0], 1, model.config.hidden_size)
            want = create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=mask,
                                      past_key_values=cache, position_ids=torch.zeros(mask.shape[0], 1))
        have = lean_decode.padding_mask(mask)
        assert (have is None and want is None) or (have is not None and want is not None and torch.equal(have, want))


def test_a_running_batch_samples_the_same_with_and_without_the_lean_step(weights, monkeypatch):
    def sample(lean: bool) -> list[tuple[list[int], list[float]]]:
        if not lean:
            monkeypatch.setattr(Weights, "lean_plan", lambda self, model: None)
        batch, jobs = RunningBatch(weights, EngineStats()), []
        for adapter, n, prompt in (("a", 3, PROMPT), ("a", 2, PROMPT[:7])):
            request = GenerateRequest(prompt_token_ids=prompt, n=n, max_tokens=12 + n, temperature=1.0, seed=7,
                                      stop_at_eos=False, adapter=adapter)
            jobs.append(Job(request))
        with torch.inference_mode():
            batch.admit(jobs[:1])
            batch.step()
            batch.admit(jobs[1:])  # joins the running rows
            while batch.rows:
                batch.step()
        monkeypatch.undo()
        return [(s.token_ids, s.logprobs) for job in jobs for s in job.future.result().sequences]

    assert sample(lean=True) == sample(lean=False)


def test_models_and_batches_it_does_not_cover_take_transformers_forward(weights, tiny_model_dir):
    model = weights.use(["a"])
    assert lean_decode.supports(model) and weights.lean_plan(model) is not None
    model.train()
    try:
        assert not lean_decode.supports(model)
    finally:
        model.eval()
    weights.use(["a", "b"])  # a mixed batch: RunningBatch.step asks for no plan (PEFT's adapter_names)
    other = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert not lean_decode.supports(other)
