"""Micro-batch planning and row packing (`tx.backends.torch.plan`): pure decisions on lengths."""

from __future__ import annotations

import pytest

from tx.backends.torch.plan import Segment, pack_rows, pad_rows, plan_micro_batches


@pytest.mark.parametrize(
    ("lengths", "budget", "groups"),
    [
        ([3, 3, 3], 9, [[0, 1, 2]]),
        ([3, 3, 3], 8, [[0, 1], [2]]),
        ([3, 3, 3], 1, [[0], [1], [2]]),  # each longer than the budget: alone
        ([2, 10, 2, 2], 5, [[0], [1], [2, 3]]),  # the long one alone, order kept
        ([5], 5, [[0]]),
    ],
)
def test_micro_batches_keep_order_and_budget(lengths, budget, groups):
    assert plan_micro_batches(lengths, budget) == groups


def test_a_zero_budget_is_refused():
    with pytest.raises(ValueError, match="budget"):
        plan_micro_batches([1], 0)


def test_pack_rows_first_fit_decreasing_with_tails():
    layout = pack_rows([4, 8, 3, 5])  # rows of 8: [8], [5, 3], [4 + a tail of 4]
    assert (layout.width, layout.num_rows) == (8, 3)
    assert layout.segments == [Segment(0, 2, 0, 4), Segment(1, 0, 0, 8), Segment(2, 1, 5, 3), Segment(3, 1, 0, 5)]
    assert layout.tails() == [(2, 4, 4)]


def test_equal_lengths_pack_one_per_row_without_tails():
    layout = pack_rows([6, 6, 6])
    assert layout.num_rows == 3 and layout.tails() == []
    assert [(s.row, s.start) for s in layout.segments] == [(0, 0), (1, 0), (2, 0)]


def test_pad_rows_is_one_datum_per_row():
    layout = pad_rows([2, 5])
    assert layout.segments == [Segment(0, 0, 0, 2), Segment(1, 1, 0, 5)]
    assert layout.tails() == [(0, 2, 3)]


@pytest.mark.parametrize(
    ("lengths", "budget", "groups"),
    [
        ([3, 9, 2, 8], 18, [[1, 3], [0, 2]]),  # longest first: 9 + 8 padded to 2 x 9 fits, a third would not
        ([4, 4, 4, 4], 12, [[0, 1, 2], [3]]),
        ([2, 10, 2], 5, [[1], [0, 2]]),  # the long one alone
    ],
)
def test_padded_micro_batches_budget_their_padded_size(lengths, budget, groups):
    assert plan_micro_batches(lengths, budget, padded=True) == groups
