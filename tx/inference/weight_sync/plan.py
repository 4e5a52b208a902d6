"""Bucket planning, shared by sender and receiver so both derive the same flat broadcasts from one update.

A bucket is a flat uint8 buffer: tensors of any dtype are packed back to back as bytes (each at an offset
aligned to `ALIGN_BYTES`), so a model mixing bfloat16 weights and float32 norms does not fragment into
many small broadcasts and the send order stays the caller's order. Tensors fill a bucket in order until the
next one would pass `bucket_bytes`; a tensor larger than `bucket_bytes` travels alone in a bucket of its own
size.

A bucket goes on the wire as one or more `Piece`s (byte ranges of it, each its own broadcast). On gloo every
tensor of at least `DIRECT_BYTES` is a piece of its own, so the sender can broadcast it straight from the
caller's memory instead of copying it into the bucket first (on a few CPU cores that copy competes with the
socket copies, and on a busy machine its thread-pool hand-offs stall); runs of smaller tensors stay packed.
NCCL sends each bucket as one piece (packing on the GPU is nearly free; fewer, larger NCCL calls are better).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tx.inference.weight_sync.types import TensorSpec, TransferUpdate, dtype_name

DEFAULT_BUCKET_BYTES = 64 << 20
ALIGN_BYTES = 64
DIRECT_BYTES = 1 << 20


@dataclass(frozen=True)
class Piece:
    """Bytes `start : end` of a bucket, broadcast as one unit; `spec` is the index (in the bucket) of the one
    tensor the piece holds exactly, or None for a packed run of tensors."""

    start: int
    end: int
    spec: int | None


@dataclass(frozen=True)
class Bucket:
    """One flat buffer: `specs[i]` occupies bytes `offsets[i] : offsets[i] + specs[i].nbytes`."""

    specs: list[TensorSpec]
    offsets: list[int]
    nbytes: int

    def pieces(self, direct_bytes: int | None = DIRECT_BYTES) -> list[Piece]:
        """The non-empty byte ranges to broadcast, in order: each tensor of at least `direct_bytes` alone, the
        tensors between them packed together; with `direct_bytes=None` the whole bucket as one piece."""
        if direct_bytes is None:
            return [Piece(0, self.nbytes, None)] if self.nbytes else []
        pieces: list[Piece] = []
        run_start: int | None = None
        for index, (spec, offset) in enumerate(zip(self.specs, self.offsets)):
            if spec.nbytes >= direct_bytes:
                if run_start is not None and offset > run_start:
                    pieces.append(Piece(run_start, offset, None))
                pieces.append(Piece(offset, offset + spec.nbytes, index))
                run_start = None
            elif run_start is None:
                run_start = offset
        if run_start is not None and self.nbytes > run_start:
            pieces.append(Piece(run_start, self.nbytes, None))
        return pieces


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
