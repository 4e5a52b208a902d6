"""The embedded engine checks itself when its base model loads (`selfcheck.py`): each family passes in every
form it serves, a family whose code the engine's path breaks gets the exact fallback (its own attention, one
request per batch, no copied rows), and a model no form serves exactly is refused with a 400 naming the check.

The engine's scheduler and weights run in this process (no HTTP), except for the refusal, which is an HTTP status.
"""

from __future__ import annotations

import pytest
import torch
from families import FAMILIES
from reference_logprobs import token_logprobs

from tx.inference.engines.embedded import generate
from tx.inference.engines.embedded.config import EmbeddedEngineConfig
from tx.inference.engines.embedded.engine import EmbeddedEngine
from tx.inference.engines.embedded.scheduler import Scheduler
from tx.inference.engines.embedded.weights import Weights
from tx.inference.protocol import GenerateRequest
from tx.models.auto import load_pretrained
from tx.types import UserError

PROMPTS = ([5, 17, 230, 1000, 44], [100, 200, 300, 7, 7, 9, 1500, 3, 900, 12, 8], [64, 2000])
STOPS = list(range(0, 2048, 7))  # rows stop at different steps


FALLBACKS = {
    "glm_moe_dsa": {"attention": "sdpa"},  # its sparse mask is built only under implementations so named
    "mistral_large4": {"attention": "sdpa"},  # the same DSA code: dense attention under the engine's (4.6 nats)
    "deepseek_v4": {"padded": False},  # its compressors: see below
}
"""What the self-check falls back to per family, with transformers 5.23 on CPU (the rest pass every form)."""


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_is_served_exactly_in_the_forms_it_passes(family: str, family_model_dirs) -> None:
    weights = Weights(family_model_dirs[family], max_adapters=1)
    plan = weights.serving
    engine_attention = "tx_gqa_sdpa" if weights.family_attention == "sdpa" else weights.family_attention
    expected = {"attention": engine_attention, "padded": True, "reorder": True, "joins": True}
    expected |= FALLBACKS.get(family, {})
    assert plan.refused is None
    assert {key: getattr(plan, key) for key in expected} == expected, plan.measured


def _samples_match_the_model(model_dir, weights: Weights) -> set[int]:
    """Sample PROMPTS (n=4 each, one batch) and check every token's logprob against the model's own forward;
    the lengths the rows reached."""
    scheduler = Scheduler(weights, max_batch_size=32, batch_wait_s=0.05)
    scheduler.start()
    try:
        futures = [scheduler.submit(GenerateRequest(prompt_token_ids=list(prompt), n=4, max_tokens=10, seed=i,
                                                    stop_at_eos=False, stop_token_ids=STOPS))
                   for i, prompt in enumerate(PROMPTS)]
        responses = [future.result(timeout=120) for future in futures]
    finally:
        scheduler.close()
    reference = load_pretrained(model_dir, dtype=torch.float32).eval()
    lengths = set()
    for prompt, response in zip(PROMPTS, responses, strict=True):
        for sequence in response.sequences:
            lengths.add(len(sequence.token_ids))
            expected = token_logprobs(reference, list(prompt), sequence.token_ids)
            assert sequence.logprobs == pytest.approx(expected, abs=1e-4)
    return lengths


def test_a_family_branching_on_the_attention_name_runs_its_own(family_model_dirs) -> None:
    """GLM-5 builds its sparse attention mask only for implementations named eager or sdpa: under the engine's
    own SDPA function it ran dense attention, 3-4 nats off the trainer (was: served silently wrong)."""
    model_dir = family_model_dirs["glm_moe_dsa"]
    weights = Weights(model_dir, max_adapters=1)
    assert weights.serving.attention == "sdpa" and weights.serving.measured["alone"] > 1.0
    assert weights.serving.refused is None and weights.serving.padded and weights.serving.reorder
    assert len(_samples_match_the_model(model_dir, weights)) > 2


def test_a_family_whose_cache_breaks_padding_gets_one_request_per_batch(family_model_dirs) -> None:
    """DeepSeek-V4's compressors window each row from column 0, pad included: padded batches were 0.4-2.4 nats
    off (and on transformers 5.19 num_samples > 1 raised: its cache reorder left the compressors' buffers)."""
    model_dir = family_model_dirs["deepseek_v4"]
    weights = Weights(model_dir, max_adapters=1)
    assert weights.serving.refused is None and not weights.serving.padded, weights.serving
    assert len(_samples_match_the_model(model_dir, weights)) > 2


def test_a_cache_that_reorders_wrongly_gets_samples_prefilled_as_copies(tiny_model_dir, monkeypatch) -> None:
    """Fault injection: `select_rows` re-indexes the mask and positions but leaves the cache as it was (as
    DeepSeek-V4's cache left its compressors' buffers on transformers 5.19). The self-check's rows form fails,
    so a request's samples are prefilled as copies of its prompt and rows that stop stay until all have: every
    sample still gets the model's own logprobs, and no row is ever re-indexed."""
    select_rows = generate.DecodeBatch.select_rows
    calls = []

    def stale(self, indices):
        calls.append(len(indices))
        cache = self.cache
        cache.reorder_cache = lambda index: None  # this call only: the instance's attribute hides the method
        try:
            select_rows(self, indices)
        finally:
            del cache.reorder_cache

    monkeypatch.setattr(generate.DecodeBatch, "select_rows", stale)
    weights = Weights(tiny_model_dir, max_adapters=1)
    plan = weights.serving
    assert plan.refused is None and plan.padded and not plan.reorder and not plan.joins, plan
    checked = len(calls)
    assert len(_samples_match_the_model(tiny_model_dir, weights)) > 2
    assert len(calls) == checked, "the engine re-indexed rows the self-check found it cannot"


def test_a_model_no_form_serves_exactly_is_refused_naming_the_check(tiny_model_dir, monkeypatch) -> None:
    """Fault injection: every decode step's logits are shifted, so no form of the engine's path matches the
    model; the engine refuses each request with a 400 instead of serving it wrong."""
    step = generate.DecodeBatch.step

    def skewed(self, model, tokens, lean=None):
        logits = step(self, model, tokens, lean)
        logits[:, 0] += 5.0
        return logits

    monkeypatch.setattr(generate.DecodeBatch, "step", skewed)
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_dir=tiny_model_dir, cluster_secret="s" * 16, device="cpu"))
    try:
        assert engine.weights.serving.refused is not None
        with pytest.raises(UserError, match="self-check 'alone'"):
            engine.submit(GenerateRequest(prompt_token_ids=[5, 6, 7], max_tokens=2))
    finally:
        engine.close()
