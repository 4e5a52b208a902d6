"""Wire types of the weight transfer: pydantic models that travel as JSON over HTTP.

Design / who owns what:
- The manager builds a `TransferInit` per engine group and posts it to each engine's `POST /weights/init`;
  the trainer (rank 0, the sender) and the engine's workers (ranks `rank_offset + i`) then join one group.
- For every push the trainer builds a `TransferUpdate` with `plan_update` and posts it to
  `POST /weights/update` while it broadcasts; both sides derive the same buckets from it
  (`plan.layout_buckets`; flat byte buffers).
- Colocated engines (one GPU shared by trainer and engine) get an `IpcUpdate` instead: CUDA IPC handles as
  JSON.
Nothing here is pickled; tensors never travel inside these models.
"""

from __future__ import annotations

import secrets
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

# Explicit dtype table: the only names accepted on the wire.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
_DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}


class WeightSyncError(RuntimeError):
    """A weight transfer failed: rendezvous timeout, broken group, mismatched update, missing tensor."""


def dtype_from_name(name: str) -> torch.dtype:
    """Map a wire dtype name ("bfloat16") to a torch dtype; unknown names raise ValueError."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """Map a torch dtype to its wire name; dtypes outside the table raise ValueError."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype}; expected one of {sorted(DTYPES)}") from None


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TransferInit(_Wire):
    """Group membership for collective transfers; sent by the manager to each engine's POST /weights/init."""

    backend: Literal["gloo", "nccl"] = Field(description="gloo on CPU, nccl between distinct GPUs")
    master_address: str = Field(description="the trainer's address (127.0.0.1 on one machine)")
    master_port: int = Field(ge=1, le=65535, description="port of the rendezvous store hosted by the sender (rank 0)")
    world_size: int = Field(ge=2, description="1 sender + all receiver ranks")
    rank_offset: int = Field(ge=1, description="this engine's first rank; its worker i gets rank_offset + i")
    group_name: str = Field(min_length=1, description="unique per group (new after every engine restart)")
    timeout_s: float = Field(default=60.0, gt=0, description="rendezvous and per-collective timeout")
    store_token: str = Field(
        default_factory=lambda: secrets.token_hex(32), min_length=32, repr=False,
        description="what the rendezvous store asks of every rank but 0 (new per group; rendezvous.py)",
    )


class TensorSpec(_Wire):
    """One tensor of an update: its name, wire dtype name and shape."""

    name: str
    dtype: str
    shape: list[int]

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        dtype_from_name(value)
        return value

    @field_validator("shape")
    @classmethod
    def _non_negative(cls, value: list[int]) -> list[int]:
        if any(dim < 0 for dim in value):
            raise ValueError(f"negative dimension in shape {value}")
        return value

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int:
        return self.numel * self.torch_dtype.itemsize


class TransferUpdate(_Wire):
    """One push over a collective group; posted to each engine's POST /weights/update."""

    tensors: list[TensorSpec] = Field(description="in send order")
    bucket_bytes: int = Field(gt=0, description="bound on one flat broadcast (a larger tensor goes alone)")


class CudaIpcHandle(_Wire):
    """The fields of `torch.multiprocessing.reductions.reduce_tensor` for one flat uint8 CUDA buffer, as JSON.

    Byte fields are base64 (None where torch gave None). `device_uuid` lets the receiver map to its own device
    index, which can differ from the sender's when CUDA_VISIBLE_DEVICES differs between the processes.
    """

    device_uuid: str
    storage_handle_b64: str
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle_b64: str | None
    ref_counter_offset: int
    event_handle_b64: str | None
    event_sync_required: bool
    numel: int = Field(description="bytes in the flat buffer")


class IpcTensorSpec(TensorSpec):
    """A tensor inside a shared buffer: `offset` is its first byte."""

    offset: int = Field(ge=0)


class IpcBucket(_Wire):
    """One shared flat buffer and the tensors packed into it."""

    handle: CudaIpcHandle
    tensors: list[IpcTensorSpec]


class IpcUpdate(_Wire):
    """A CUDA IPC push, buckets in order; the sender keeps the buffers alive until acknowledged."""

    buckets: list[IpcBucket]
