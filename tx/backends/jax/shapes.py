"""Fixed shapes for the compiler: length buckets, row buckets and micro-batches by a token budget.

XLA compiles once per input shape. So a request's datums are sorted by length (longest first) and cut into
micro-batches of at most `token_budget` padded tokens; each micro-batch is padded to
- a length bucket: the next power of two from 16, capped by the model's context length, and
- a row bucket: the next power of two, rounded up to a multiple of the device count (rows are split over
  the devices).
A run therefore compiles at most once per (length bucket, row bucket) pair, whatever lengths arrive. A
sequence longer than the budget still runs, alone in its micro-batch. No jax here: this is pure planning.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tx.backends.datums import DatumRules, check_datum, check_not_empty, text_tokens
from tx.backends.losses import TARGET_KEY, LossFn
from tx.types import BaseModelInfo, Datum

MIN_BUCKET = 16


@dataclass
class MicroBatch:
    """Datums `indices` (of the request) padded into arrays of one bucketed shape (R rows, T positions,
    K targets per position). `mask` marks real (row, position, target) entries."""

    indices: list[int]
    input_ids: np.ndarray  # (R, T) int32
    targets: np.ndarray  # (R, T, K) int32
    inputs: dict[str, np.ndarray]  # name -> (R, T, K) float32
    mask: np.ndarray  # (R, T, K) bool


def length_bucket(length: int, max_length: int) -> int:
    """The smallest power of two >= `length` (at least 16), capped by `max_length`."""
    bucket = MIN_BUCKET
    while bucket < length:
        bucket *= 2
    return min(bucket, max(max_length, length))


def _pow2_at_most(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _row_bucket(rows: int, devices: int) -> int:
    bucket = 1 << (rows - 1).bit_length()
    return -(-bucket // devices) * devices


def plan(
    lengths: list[int], token_budget: int, max_length: int, devices: int = 1
) -> list[tuple[list[int], int, int]]:
    """(datum indices, padded length, padded rows) of each micro-batch, longest datums first."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, start = [], 0
    while start < len(order):
        length = length_bucket(lengths[order[start]], max_length)
        cap = _pow2_at_most(token_budget // length)
        taken = order[start : start + cap]
        batches.append((taken, length, _row_bucket(len(taken), devices)))
        start += len(taken)
    return batches


Checked = list[tuple[list[int], dict[str, np.ndarray]]]  # each datum's tokens and loss arrays


def validate(data: list[Datum], loss: LossFn, info: BaseModelInfo) -> Checked:
    """Each datum's tokens and loss arrays, checked by the rules every backend shares (`datums.py`; this
    backend trains text models); UserError names the datum."""
    check_not_empty(data)
    rules = DatumRules(info)
    checked = []
    for index, datum in enumerate(data):
        tokens = text_tokens(datum.model_input, index)
        arrays = check_datum(datum, tokens, len(tokens), loss, rules, index)
        checked.append((tokens.tolist(), arrays))
    return checked


def pack(checked: Checked, indices: list[int], length: int, rows: int) -> MicroBatch:
    """Datums `indices` of `checked`, right-padded to (rows, length, K) with zeros (masked out)."""
    width = max(_width(checked[i][1][TARGET_KEY].shape) for i in indices)
    input_ids = np.zeros((rows, length), np.int32)
    mask = np.zeros((rows, length, width), bool)
    keys = checked[indices[0]][1].keys()
    packed = {key: np.zeros((rows, length, width), np.float32) for key in keys if key != TARGET_KEY}
    targets = np.zeros((rows, length, width), np.int32)
    for row, index in enumerate(indices):
        tokens, arrays = checked[index]
        n, k = len(tokens), _width(arrays[TARGET_KEY].shape)
        input_ids[row, :n] = tokens
        mask[row, :n, :k] = True
        targets[row, :n, :k] = arrays[TARGET_KEY].reshape(n, k)
        for key in packed:
            packed[key][row, :n, :k] = arrays[key].reshape(n, k)
    return MicroBatch(indices, input_ids, targets, packed, mask)


def unpack(values: np.ndarray, batch: MicroBatch, checked: Checked) -> dict[int, np.ndarray]:
    """Per-datum float32 arrays of a (R, T, K) result, each in its datum's target shape, by datum index."""
    out = {}
    for row, index in enumerate(batch.indices):
        shape = checked[index][1][TARGET_KEY].shape
        piece = values[row, : shape[0], : _width(shape)]
        out[index] = np.array(piece if len(shape) == 2 else piece[:, 0], dtype=np.float32)
    return out


def _width(shape: tuple[int, ...]) -> int:
    return shape[1] if len(shape) == 2 else 1
