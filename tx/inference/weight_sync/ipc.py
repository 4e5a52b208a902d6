"""Weight transfer through CUDA IPC, for a trainer and an engine that share one GPU (NCCL cannot: one rank
per GPU). CUDA only; elsewhere the constructors raise WeightSyncError.

Design / who owns what:
- The sender packs tensors into flat uint8 CUDA buffers and describes each with the fields of
  `torch.multiprocessing.reductions.reduce_tensor` as JSON (`IpcUpdate`); the manager posts it to the engine.
- The receiver maps each buffer on its own device (matched by UUID), yields views, and synchronizes.
- The sender keeps the buffers alive until `release()`, which the caller runs after the engine acknowledged.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch

from tx.inference.weight_sync.plan import (
    DEFAULT_BUCKET_BYTES,
    Bucket,
    check_unique,
    layout_buckets,
    spec_of,
    view_in,
)
from tx.inference.weight_sync.types import (
    CudaIpcHandle,
    IpcBucket,
    IpcTensorSpec,
    IpcUpdate,
    WeightSyncError,
)


class IpcSender:
    """Shares packed copies of the trainer's tensors through CUDA IPC handles."""

    def __init__(self, device: torch.device | None = None) -> None:
        """`device`: the CUDA device holding the shared buffers (default: the current one)."""
        self.device = _cuda_device(device)
        self._buffers: list[torch.Tensor] = []

    def share(
        self, named: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> IpcUpdate:
        """Pack `named` into buffers and return their handles; the buffers live until `release()`."""
        return IpcUpdate(buckets=[self._share(bucket, named) for bucket in _layout(named, bucket_bytes)])

    def iter_updates(
        self, named: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> Iterator[IpcUpdate]:
        """One single-bucket IpcUpdate at a time, for bounded memory; each buffer is released on the next step
        (the caller sends each update and waits for its acknowledgement before advancing)."""
        for bucket in _layout(named, bucket_bytes):
            self.release()
            yield IpcUpdate(buckets=[self._share(bucket, named)])
        self.release()

    def release(self) -> None:
        """Drop the shared buffers (after the receiver acknowledged)."""
        self._buffers.clear()

    def _share(self, bucket: Bucket, named: Sequence[tuple[str, torch.Tensor]]) -> IpcBucket:
        by_name = dict(named)
        buffer = torch.empty(max(bucket.nbytes, 1), dtype=torch.uint8, device=self.device)
        for spec, offset in zip(bucket.specs, bucket.offsets):
            view_in(buffer, spec, offset).copy_(by_name[spec.name])
        torch.cuda.current_stream(self.device).synchronize()  # the receiver reads on another stream
        self._buffers.append(buffer)
        specs = [
            IpcTensorSpec(**spec.model_dump(), offset=offset)
            for spec, offset in zip(bucket.specs, bucket.offsets)
        ]
        return IpcBucket(handle=_handle_of(buffer), tensors=specs)


class IpcReceiver:
    """Maps the sender's buffers in an engine process."""

    def __init__(self, device: torch.device | None = None) -> None:
        """`device`: this process's CUDA device (default: the current one)."""
        self.device = _cuda_device(device)

    def receive(self, update: IpcUpdate) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, view) in order; views alias the sender's memory, so load (copy) them before
        acknowledging. Synchronizes the device when the iteration ends."""
        check_unique([spec.name for bucket in update.buckets for spec in bucket.tensors])
        for bucket in update.buckets:
            buffer = _open_handle(bucket.handle, self.device)
            for spec in bucket.tensors:
                if spec.offset + spec.nbytes > buffer.numel():
                    raise WeightSyncError(f"tensor {spec.name!r} lies outside its shared buffer")
                yield spec.name, view_in(buffer, spec, spec.offset)
        torch.cuda.synchronize(self.device)


def _layout(named: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[Bucket]:
    specs = [spec_of(name, tensor) for name, tensor in named]
    check_unique([spec.name for spec in specs])
    return layout_buckets(specs, bucket_bytes)


def _cuda_device(device: torch.device | None) -> torch.device:
    if not torch.cuda.is_available():
        raise WeightSyncError("CUDA IPC weight transfer needs a CUDA GPU; use a gloo group on CPU")
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda":
        raise WeightSyncError(f"CUDA IPC weight transfer needs a CUDA device, got {device}")
    return torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())


def cuda_device_uuid(index: int) -> str:
    """The UUID of CUDA device `index` (as this process numbers it): the same string in every process that
    sees that GPU, whatever CUDA_VISIBLE_DEVICES says. Reads device properties only; allocates nothing."""
    return str(torch.cuda.get_device_properties(index).uuid)


def _device_by_uuid(uuid: str) -> int:
    for index in range(torch.cuda.device_count()):
        if cuda_device_uuid(index) == uuid:
            return index
    raise WeightSyncError(
        f"the sender's GPU {uuid} is not visible to this process (check CUDA_VISIBLE_DEVICES)"
    )


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _handle_of(buffer: torch.Tensor) -> CudaIpcHandle:
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = cast("tuple[object, tuple[Any, ...]]", reduce_tensor(buffer))  # a CUDA tensor's rebuild args
    (_, _, _, _, _, _, device, handle, size, offset, _, ref_handle, ref_offset, event, event_sync) = args
    return CudaIpcHandle(
        device_uuid=cuda_device_uuid(device),
        storage_handle_b64=base64.b64encode(handle).decode("ascii"),
        storage_size_bytes=size,
        storage_offset_bytes=offset,
        ref_counter_handle_b64=_b64(ref_handle),
        ref_counter_offset=ref_offset,
        event_handle_b64=_b64(event),
        event_sync_required=event_sync,
        numel=buffer.numel(),
    )


def _open_handle(handle: CudaIpcHandle, device: torch.device) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    index = _device_by_uuid(handle.device_uuid)
    if index != device.index:
        raise WeightSyncError(f"shared buffer lives on cuda:{index}, but this receiver is on {device}")
    return rebuild_cuda_tensor(
        torch.Tensor,
        (handle.numel,),
        (1,),
        0,
        torch.storage.TypedStorage,  # what reduce_tensor sends; it forwards to UntypedStorage
        torch.uint8,
        index,
        base64.b64decode(handle.storage_handle_b64),
        handle.storage_size_bytes,
        handle.storage_offset_bytes,
        False,
        _unb64(handle.ref_counter_handle_b64),
        handle.ref_counter_offset,
        _unb64(handle.event_handle_b64),
        handle.event_sync_required,
    )
