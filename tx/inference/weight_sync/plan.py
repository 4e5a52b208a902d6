"""Bucket planning, shared by sender and receiver so both derive the same flat broadcasts from one update.

A bucket is a flat uint8 buffer: tensors of any dtype are packed back to back as bytes (each at an offset
aligned to `ALIGN_BYTES`), so a model mixing bfloat16 weights and float32 norms does not fragment into
many small broadcasts and the send order stays the caller's order. Tensors fill a bucket in order until the
next one would pass `bucket_bytes`; a tensor larger than `bucket_bytes` travels alone in a bucket of its own
size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tx.inference.weight_sync.types import TensorSpec, TransferUpdate, dtype_name

DEFAULT_BUCKET_BYTES = 64 << 20
ALIGN_BYTES = 64


@dataclass(frozen=True)
class Bucket:
    """One flat buffer: `specs[i]` occupies bytes `offsets[i] : offsets[i] + specs[i].nbytes`."""

    specs: list[TensorSpec]
    offsets: list[int]
    nbytes: int


def plan_update(
    named: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> TransferUpdate:
    """Describe `named` (in this order) as a TransferUpdate; unknown dtypes or duplicate names: ValueError."""
    specs = [spec_of(name, tensor) for name, tensor in named]
    check_unique([spec.name for spec in specs])
    return TransferUpdate(tensors=specs, bucket_bytes=bucket_bytes)


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name=name, dtype=dtype_name(tensor.dtype), shape=list(tensor.shape))


def check_unique(names: Sequence[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"tensor {name!r} appears twice in one update")
        seen.add(name)


def layout_buckets(specs: Sequence[TensorSpec], bucket_bytes: int) -> list[Bucket]:
    """Split `specs` into buckets, deterministically, keeping their order."""
    buckets: list[Bucket] = []
    current: list[TensorSpec] = []
    offsets: list[int] = []
    end = 0
    for spec in specs:
        start = _align(end)
        if current and start + spec.nbytes > bucket_bytes:
            buckets.append(Bucket(current, offsets, end))
            current, offsets, start = [], [], 0
        current.append(spec)
        offsets.append(start)
        end = start + spec.nbytes
    if current:
        buckets.append(Bucket(current, offsets, end))
    return buckets


def view_in(buffer: torch.Tensor, spec: TensorSpec, offset: int) -> torch.Tensor:
    """The tensor `spec` as a view of the flat uint8 `buffer` at byte `offset`."""
    flat = buffer[offset : offset + spec.nbytes]
    return flat.view(spec.torch_dtype).view(spec.shape)


def _align(offset: int) -> int:
    return (offset + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES
