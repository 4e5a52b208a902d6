"""How a request's datums are cut into micro-batches, and how a micro-batch's datums are laid into rows.

Pure decisions on sequence lengths, no torch, tested row by row.

- Micro-batches: datums in request order, each micro-batch as many datums as fit in `budget` tokens.
  A datum longer than the budget runs alone (it is never split: a loss may look at a whole datum).
  Gradients accumulate across micro-batches, so the result does not depend on the cut. For padded rows
  (a model whose layers cannot keep packed datums apart, `packing.py`), a micro-batch costs its rows times
  its longest datum, and datums go longest first, so that rows of one micro-batch have similar lengths.
- Rows (packing): a micro-batch's datums are laid end to end into rows as wide as its longest datum,
  first fit by decreasing length. A row's unused tail becomes a padding segment of its own (position ids
  restarting at 0), so attention never crosses a datum boundary and no attention mask is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def plan_micro_batches(lengths: Sequence[int], budget: int, padded: bool = False) -> list[list[int]]:
    """Datum indices per micro-batch; each holds at most `budget` tokens unless a single datum alone is
    longer. Packed (the default): in request order. `padded`: longest datums first, each micro-batch's cost
    its number of datums times its longest (what its padded rows hold)."""
    if budget < 1:
        raise ValueError(f"micro-batch budget must be >= 1 token, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)) if padded else range(len(lengths))
    groups: list[list[int]] = []
    for index in order:
        if not groups or _cost([*groups[-1], index], lengths, padded) > budget:
            groups.append([])
        groups[-1].append(index)
    return groups


def _cost(group: list[int], lengths: Sequence[int], padded: bool) -> int:
    """Positions the micro-batch `group` runs: its tokens packed, its rows times its longest padded."""
    if padded:
        return len(group) * max(lengths[i] for i in group)
    return sum(lengths[i] for i in group)


@dataclass(frozen=True)
class Segment:
    """One datum's place in a packed micro-batch: `row`, first column `start`, `length` tokens."""

    datum: int  # index into the micro-batch's datums
    row: int
    start: int
    length: int


@dataclass(frozen=True)
class RowLayout:
    """Where each datum of a micro-batch sits: `segments` in datum order, `num_rows` rows of `width`."""

    segments: list[Segment]
    num_rows: int
    width: int

    def tails(self) -> list[tuple[int, int, int]]:
        """(row, start, length) of each row's unused tail (the padding segments)."""
        filled = [0] * self.num_rows
        for seg in self.segments:
            filled[seg.row] = max(filled[seg.row], seg.start + seg.length)
        return [(row, used, self.width - used) for row, used in enumerate(filled) if used < self.width]


def pack_rows(lengths: Sequence[int]) -> RowLayout:
    """First-fit-decreasing packing of `lengths` into rows of width max(lengths)."""
    width = max(lengths)
    free: list[int] = []  # free columns left in each row
    placed: dict[int, Segment] = {}
    for datum in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[datum]
        row = next((r for r, room in enumerate(free) if room >= length), len(free))
        if row == len(free):
            free.append(width)
        placed[datum] = Segment(datum, row, width - free[row], length)
        free[row] -= length
    return RowLayout([placed[i] for i in range(len(lengths))], len(free), width)


def pad_rows(lengths: Sequence[int]) -> RowLayout:
    """One datum per row, right-padded to the longest (the layout without packing)."""
    return RowLayout([Segment(i, i, 0, n) for i, n in enumerate(lengths)], len(lengths), max(lengths))
