"""The sampler's sort (tx/inference/engines/embedded/sorting.py) gives exactly what `torch.sort` gives: the same
sorted values, and at any drawn position the same id, ties and NaN included, so a seeded sample draws the same
token as with the full sort."""

from __future__ import annotations

import torch

from tx.inference.engines.embedded.sorting import ids_at, sorted_descending


def _logits_with_ties() -> torch.Tensor:
    logits = torch.randn(6, 2048, generator=torch.Generator().manual_seed(0))
    logits[1] = (logits[1] * 2).round()  # many ties in one row
    logits[2, [3, 900, 2047]] = float(logits[2, 50])  # a few in another
    logits[3, 10], logits[3, 11] = 0.0, -0.0  # equal, different bits
    logits[4, 7] = float("nan")
    logits[5, :] = 1.5  # all equal
    return logits


def test_the_sorted_values_and_every_positions_id_are_torch_sorts():
    logits = _logits_with_ties()
    reference = torch.sort(logits, dim=-1, descending=True)
    values = sorted_descending(logits)
    finite = ~reference.values.isnan()
    assert torch.equal(values[finite], reference.values[finite])
    assert torch.equal(values.isnan(), reference.values.isnan())
    tied = [(reference.values[2] == logits[2, 50]).nonzero(), (reference.values[3] == 0.0).nonzero()]
    for position in sorted({*range(0, logits.shape[1], 16), *torch.cat(tied)[:, 0].tolist()}):
        positions = torch.full((logits.shape[0],), position)
        ids = ids_at(logits, values, positions)
        assert torch.equal(ids, reference.indices[:, position]), f"position {position}"
