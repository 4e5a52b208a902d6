"""The embedded engine's draws (tx/inference/engines/embedded/generate.py): each route (temperature alone over
the unsorted distribution, top-k over a partial selection, top-p over the sorted logits) draws from the right
distribution, and a seeded row draws the same token whatever batch and routes it shares a step with."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tx.inference.engines.embedded.generate import BLOCK, Row, sample_next
from tx.inference.protocol import GenerateRequest

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
DRAWS = 40_000


def rows(count: int, **settings) -> list[Row]:
    request = GenerateRequest(prompt_token_ids=[1], seed=0, **settings)
    return [Row.create(request, i, eos_ids=()) for i in range(count)]


def frequencies(batch: list[Row], never: tuple[int, ...] = ()) -> np.ndarray:
    tokens, _, _ = sample_next(LOGITS.expand(len(batch), -1).clone(), batch, never)
    return np.bincount(tokens, minlength=len(LOGITS)) / len(batch)


def expected(temperature: float, top_k: int = -1, top_p: float = 1.0, never: tuple[int, ...] = ()) -> np.ndarray:
    scaled = (LOGITS / temperature).double()
    scaled[list(never)] = float("-inf")
    order = torch.argsort(scaled, descending=True)
    if top_k > 0:
        scaled[order[top_k:]] = float("-inf")
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        mass_before = probs[order].cumsum(0) - probs[order]
        probs[order[mass_before >= top_p]] = 0.0
    return (probs / probs.sum()).numpy()


@pytest.mark.parametrize("settings", [
    {"temperature": 1.0}, {"temperature": 0.5}, {"temperature": 2.0},
    {"temperature": 1.0, "top_k": 3}, {"temperature": 0.7, "top_k": 5, "top_p": 0.8},
    {"temperature": 1.0, "top_p": 0.7}, {"temperature": 1.5, "top_p": 0.95},
])
def test_each_route_draws_from_its_distribution(settings: dict) -> None:
    want = expected(settings["temperature"], settings.get("top_k", -1), settings.get("top_p", 1.0))
    got = frequencies(rows(DRAWS, **settings))
    # 5 standard errors of a binomial frequency at DRAWS draws, per id
    bound = 5 * np.sqrt(want * (1 - want) / DRAWS) + 1e-9
    assert np.all(np.abs(got - want) <= bound), (got.round(4), want.round(4))
    assert np.all(got[want == 0] == 0)  # masked ids never drawn


def test_an_id_never_to_be_drawn_is_not_drawn_on_the_plain_route() -> None:
    got = frequencies(rows(DRAWS, temperature=1.0), never=(0, 3))
    want = expected(1.0, never=(0, 3))
    assert got[0] == got[3] == 0
    assert np.all(np.abs(got - want) <= 5 * np.sqrt(want * (1 - want) / DRAWS) + 1e-9)


def test_a_seeded_row_draws_the_same_alone_and_in_a_mixed_batch() -> None:
    logits = torch.randn(1, 151_936, generator=torch.Generator().manual_seed(1)) * 3
    kinds = [{"temperature": 1.0}, {"temperature": 0.8, "top_k": 50}, {"temperature": 1.0, "top_p": 0.9}]
    for step in range(3):
        mixed = [row for kind in kinds for row in rows(4, **kind)]
        alone = [row for kind in kinds for row in rows(4, **kind)]
        for row in mixed + alone:  # later steps: the generators advanced as in a running batch
            for _ in range(step):
                torch.rand((), generator=row.generator)
        together, _, _ = sample_next(logits.expand(len(mixed), -1).clone(), mixed)
        one_by_one = [sample_next(logits.clone(), [row])[0][0] for row in alone]
        assert together == one_by_one


def test_the_logprob_reported_is_the_raw_models_whatever_the_route() -> None:
    logits = torch.randn(3, 151_936, generator=torch.Generator().manual_seed(2))
    batch = [*rows(1, temperature=0.5), *rows(1, temperature=1.0, top_k=20), *rows(1, temperature=1.0, top_p=0.5)]
    tokens, logprobs, _ = sample_next(logits.clone(), batch)
    raw = torch.log_softmax(logits.double(), dim=-1)
    np.testing.assert_allclose(logprobs, [float(raw[i, t]) for i, t in enumerate(tokens)], atol=1e-5)


def test_the_two_level_draw_finds_ids_in_every_block_and_never_a_masked_one() -> None:
    """A vocabulary of 2 whole blocks and a tail: the mass on ids at block edges, in the tail, beside masked ids."""
    vocab, favoured = 2 * BLOCK + 952, [0, BLOCK - 1, BLOCK, 2 * BLOCK + 951, 1500]
    logits = torch.full((vocab,), -30.0)
    logits[favoured] = torch.tensor([1.0, 0.5, 0.0, 1.5, -0.5])
    never = (BLOCK - 2, BLOCK + 1, 2 * BLOCK + 950)
    logits[list(never)] = 5.0  # would win if drawn
    batch = rows(DRAWS, temperature=1.0)
    tokens, _, _ = sample_next(logits.expand(len(batch), -1).clone(), batch, never)
    got = np.bincount(tokens, minlength=vocab) / len(batch)
    want = torch.softmax(logits.index_fill(0, torch.tensor(never), float("-inf")).double(), dim=-1).numpy()
    assert not any(got[list(never)])
    assert np.all(np.abs(got - want) <= 5 * np.sqrt(want * (1 - want) / DRAWS) + 1e-9)
