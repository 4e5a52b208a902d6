"""Tensor checks shared by the protobuf and JSON decoders.

Both wire forms carry a tensor as flat values plus an optional shape, or as CSR (values, row
pointers, column indices, dense shape) whose unlisted cells take a pad value. Everything here
raises `UserError` with a message naming what was wrong, because every input comes from a client.
"""

from __future__ import annotations

import math

import numpy as np

from tx.types import UserError

# A dense tensor larger than this is refused before it is allocated (2 GiB of int64).
MAX_TENSOR_ELEMENTS = 1 << 28


def check_shape(shape: tuple[int, ...], what: str) -> int:
    """Validate a dense shape and return its element count."""
    if any(dim < 0 for dim in shape):
        raise UserError(f"{what}: shape {list(shape)} has a negative dimension")
    num_elements = math.prod(shape)
    if num_elements > MAX_TENSOR_ELEMENTS:
        raise UserError(
            f"{what}: shape {list(shape)} has {num_elements} elements, more than {MAX_TENSOR_ELEMENTS}"
        )
    return num_elements


def reshape_dense(flat: np.ndarray, shape: tuple[int, ...], what: str) -> np.ndarray:
    """Give flat values their declared shape; no shape means 1-D."""
    if not shape:
        return flat
    expected = check_shape(shape, what)
    if expected != flat.size:
        raise UserError(f"{what}: shape {list(shape)} needs {expected} values but {flat.size} were sent")
    return flat.reshape(shape)


def densify_csr(
    values: np.ndarray,
    crow_indices: np.ndarray,
    col_indices: np.ndarray,
    shape: tuple[int, ...],
    *,
    pad_value: int | float,
    what: str,
) -> np.ndarray:
    """Expand a 2-D CSR tensor; cells it does not list take `pad_value`."""
    if len(shape) != 2:
        raise UserError(f"{what}: a sparse CSR tensor needs a 2-D shape, got {list(shape)}")
    check_shape(shape, what)
    num_rows, num_cols = shape
    if crow_indices.size != num_rows + 1:
        raise UserError(
            f"{what}: crow_indices has {crow_indices.size} entries; shape {list(shape)} needs {num_rows + 1}"
        )
    nnz = col_indices.size
    if values.size != nnz:
        raise UserError(f"{what}: {values.size} CSR values but {nnz} column indices")
    row_lengths = np.diff(crow_indices)
    if crow_indices[0] != 0 or crow_indices[-1] != nnz or np.any(row_lengths < 0):
        raise UserError(
            f"{what}: crow_indices must start at 0, never decrease, and end at the number of values ({nnz})"
        )
    if nnz and (col_indices.min() < 0 or col_indices.max() >= num_cols):
        raise UserError(f"{what}: a column index is outside [0, {num_cols})")
    dense = np.full((num_rows, num_cols), pad_value, dtype=values.dtype)
    rows = np.repeat(np.arange(num_rows), row_lengths)
    dense[rows, col_indices] = values
    return dense
