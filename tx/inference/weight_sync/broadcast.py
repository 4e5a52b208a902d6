"""Weight transfer over a torch.distributed collective (gloo on CPU, NCCL between GPUs).

Design / who owns what:
- The sender is rank 0 and lives in the trainer process. It hosts the group's rendezvous store at
  (master_address, master_port), behind the group's token (`rendezvous.py`). Groups are built without the
  global default process group (store -> PrefixStore(group_name) -> ProcessGroupGloo/NCCL, see `group.py`),
  so one trainer can hold one group per engine group and recreate it after a restart.
- Receivers live in engine processes (one per engine worker, rank = rank_offset + worker index).
- Both sides must call `connect()` at the same time (the engine runs it in a thread while handling
  POST /weights/init) and then run `send` / `receive` with the same `TransferUpdate`, bucket by bucket.
- Every step has a timeout (`TransferInit.timeout_s`); a failure raises WeightSyncError, never hangs forever.
"""

from __future__ import annotations

import ctypes
import mmap
from collections import deque
from collections.abc import Iterator, Mapping, Sequence

import torch

from tx.inference.weight_sync.group import TransferGroup
from tx.inference.weight_sync.plan import DIRECT_BYTES, Bucket, Piece, check_unique, layout_buckets, view_in
from tx.inference.weight_sync.types import TransferInit, TransferUpdate, WeightSyncError

RECV_AHEAD = 2  # buckets a receiver has posted while it yields the one before (as the sender keeps two)


class BroadcastSender:
    """Rank 0 of a transfer group, in the trainer process."""

    def __init__(self, init: TransferInit, device: torch.device | None = None) -> None:
        """`device`: where flat buckets are packed; default cpu for gloo, the current CUDA device for nccl."""
        self.init = init
        self.device = device or _default_device(init)
        self._group = TransferGroup(init, rank=0)
        self._buffers = _Buffers(self.device)
        self._connected = False

    def connect(self) -> None:
        """Host the rendezvous store and join the group; blocks until every rank joined, or raises after timeout_s."""
        self._group.join(self.device)
        self._connected = True

    def send(self, named: Sequence[tuple[str, torch.Tensor]], update: TransferUpdate) -> None:
        """Broadcast the tensors of `update` (looked up by name in `named`) bucket by bucket, in order.

        Each bucket goes as its pieces (`Bucket.pieces`): a large contiguous tensor straight from its own
        memory, packed runs from one of two alternating buffers. Two buckets may be on the wire at once: a
        buffer is packed again only once the bucket before last (which used it) is done.
        """
        if not self._connected:
            raise WeightSyncError(f"sender of group {self.init.group_name!r} is not connected")
        tensors = _match(named, update)
        in_flight: deque[list] = deque()
        for index, bucket in enumerate(layout_buckets(update.tensors, update.bucket_bytes)):
            if len(in_flight) == 2:
                self._group.wait(in_flight.popleft())
            works: list = []
            for piece in bucket.pieces(_direct_bytes(self.init)):
                source = None
                if piece.spec is not None:
                    source = _wire_bytes(tensors[bucket.specs[piece.spec].name], self.device)
                if source is None:
                    buffer = self._buffers.get(index % 2, bucket.nbytes)
                    _pack(buffer, bucket, tensors, piece)
                    source = buffer[piece.start : piece.end]
                works += self._group.start_broadcast(source)
            in_flight.append(works)
        while in_flight:
            self._group.wait(in_flight.popleft())

    def close(self) -> None:
        """Leave the group, stop the store and free the buffers; idempotent."""
        self._connected = False
        self._buffers.clear()
        self._group.close()


class BroadcastReceiver:
    """One receiving rank, in an engine process."""

    def __init__(self, init: TransferInit, rank: int, device: torch.device) -> None:
        """`rank` in [rank_offset, world_size); received tensors end up on `device`."""
        if not init.rank_offset <= rank < init.world_size:
            raise ValueError(f"receiver rank {rank} outside [{init.rank_offset}, {init.world_size})")
        self.init = init
        self.device = torch.device(device)
        self._wire_device = self.device if init.backend == "nccl" else torch.device("cpu")
        self._group = TransferGroup(init, rank=rank)
        self._buffers = _Buffers(self._wire_device, slots=RECV_AHEAD + 1)
        self._connected = False

    def connect(self) -> None:
        """Join the group hosted by the sender; blocks until every rank joined, or raises after timeout_s."""
        self._group.join(self._wire_device)
        self._connected = True

    def receive(
        self, update: TransferUpdate, reuse_buffers: bool = False,
        targets: Mapping[str, torch.Tensor] | None = None,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Receive bucket by bucket and yield (name, tensor) in `update.tensors` order.

        `targets` (name -> the tensor that will hold it, e.g. a model's parameters): a tensor sent as a piece
        of its own (gloo: at least `DIRECT_BYTES`) whose target has its dtype and shape and lies contiguous on
        the wire device is received straight into the target, with no buffer and no copy; it is yielded as
        the target itself (already loaded). Other tensors arrive in buffers as below.

        The next `RECV_AHEAD` buckets are received while the current one is yielded. By default every bucket
        lands in a fresh buffer, so the yielded views stay valid (`dict(receive(...))` is fine). With
        `reuse_buffers=True` (faster: no page faults; for loaders that copy each tensor at once, like
        `param.copy_`) `RECV_AHEAD + 1` buffers take turns and a tensor is overwritten once the consumer asks
        for the next bucket's tensors;
        this only applies when `device` is the wire device (cpu for gloo, the GPU for nccl).
        Consume the iterator fully: the sender waits for every bucket; if a consumer stops early, close the
        receiver (the group is unusable after a partial transfer).
        """
        if not self._connected:
            raise WeightSyncError(f"receiver of group {self.init.group_name!r} is not connected")
        check_unique([spec.name for spec in update.tensors])
        buckets = layout_buckets(update.tensors, update.bucket_bytes)
        fresh = _Buffers(self._wire_device, reuse=False, slots=RECV_AHEAD + 1)
        buffers = self._buffers if reuse_buffers else fresh
        direct = _direct_targets(update, targets or {}, self._wire_device, _direct_bytes(self.init))
        ahead = min(RECV_AHEAD, len(buckets))
        in_flight = deque(self._start(buffers, buckets, i, direct) for i in range(ahead))
        for index, bucket in enumerate(buckets):
            works, buffer = in_flight.popleft()
            self._group.wait(works)
            if index + RECV_AHEAD < len(buckets):
                in_flight.append(self._start(buffers, buckets, index + RECV_AHEAD, direct))
            if buffer is None:  # nothing of this bucket travelled in a buffer: only empty tensors use it
                buffer = torch.empty(0, dtype=torch.uint8, device=self.device)
            elif self._wire_device != self.device:
                buffer = buffer.to(self.device)
            for spec, offset in zip(bucket.specs, bucket.offsets):
                landed = direct.get(spec.name)
                yield spec.name, landed if landed is not None else view_in(buffer, spec, offset)

    def _start(
        self, buffers: _Buffers, buckets: list[Bucket], index: int, direct: dict
    ) -> tuple[list, torch.Tensor | None]:
        """Post the receives of bucket `index`: its own pieces into their targets, the rest into a buffer
        (allocated only when some piece needs it); the works and that buffer."""
        bucket, buffer, works = buckets[index], None, []
        for piece in bucket.pieces(_direct_bytes(self.init)):
            target = direct.get(bucket.specs[piece.spec].name) if piece.spec is not None else None
            if target is not None:
                works += self._group.start_broadcast(target.detach().reshape(-1).view(torch.uint8))
                continue
            if buffer is None:
                buffer = buffers.get(index % len(buffers), bucket.nbytes, fresh=True)
            works += self._group.start_broadcast(buffer[piece.start : piece.end])
        return works, buffer

    def close(self) -> None:
        """Leave the group and free the buffers; idempotent."""
        self._connected = False
        self._buffers.clear()
        self._group.close()


def _default_device(init: TransferInit) -> torch.device:
    if init.backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _direct_bytes(init: TransferInit) -> int | None:
    """Gloo sends large tensors as pieces of their own, from the caller's memory; NCCL whole buckets."""
    return DIRECT_BYTES if init.backend == "gloo" else None


def _direct_targets(
    update: TransferUpdate, targets: Mapping[str, torch.Tensor], device: torch.device,
    direct_bytes: int | None,
) -> dict[str, torch.Tensor]:
    """The targets tensors sent as pieces of their own (`Bucket.pieces`) are received straight into: same
    dtype and shape, contiguous, on `device`."""
    direct: dict[str, torch.Tensor] = {}
    for spec in update.tensors:
        if direct_bytes is None or spec.nbytes < direct_bytes:
            continue
        target = targets.get(spec.name)
        if (target is not None and target.dtype == spec.torch_dtype and list(target.shape) == spec.shape
                and target.device == device and target.is_contiguous()):
            direct[spec.name] = target
    return direct


def _wire_bytes(tensor: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """`tensor`'s bytes as a flat uint8 view when it can go on the wire as it is, else None (pack a copy)."""
    if tensor.device != device or not tensor.is_contiguous():
        return None
    return tensor.detach().reshape(-1).view(torch.uint8)


def _match(named: Sequence[tuple[str, torch.Tensor]], update: TransferUpdate) -> dict[str, torch.Tensor]:
    """Check every spec against the tensor of that name before anything goes on the wire."""
    by_name = dict(named)
    check_unique([spec.name for spec in update.tensors])
    for spec in update.tensors:
        tensor = by_name.get(spec.name)
        if tensor is None:
            raise WeightSyncError(f"update names tensor {spec.name!r}, which was not given")
        if tensor.dtype != spec.torch_dtype or list(tensor.shape) != spec.shape:
            raise WeightSyncError(
                f"tensor {spec.name!r} is {tensor.dtype} {list(tensor.shape)}, "
                f"but the update says {spec.dtype} {spec.shape}"
            )
    return by_name


class _Buffers:
    """Flat uint8 buffers used in turn (the sender: two, one on the wire while the other is packed; the
    receiver: one per bucket in flight plus the one being consumed). With `reuse` they are kept between
    buckets and transfers: a fresh 64 MB allocation faults its pages in again and halves CPU throughput.
    Without it, every `get(..., fresh=True)` allocates, so earlier views stay valid."""

    def __init__(self, device: torch.device, reuse: bool = True, slots: int = 2) -> None:
        self.device = device
        self.reuse = reuse
        self._slots: list[torch.Tensor | None] = [None] * slots

    def __len__(self) -> int:
        return len(self._slots)

    def get(self, slot: int, nbytes: int, fresh: bool = False) -> torch.Tensor:
        buffer = self._slots[slot]
        if buffer is None or buffer.numel() < nbytes or (fresh and not self.reuse):
            self._slots[slot] = None
            buffer = self._slots[slot] = _empty_bytes(nbytes, self.device)
        return buffer[:nbytes]

    def clear(self) -> None:
        self._slots = [None] * len(self._slots)


_HUGE_PAGE = 2 << 20


def _empty_bytes(nbytes: int, device: torch.device) -> torch.Tensor:
    """A flat uint8 buffer; on CPU a large one is its own mapping with transparent huge pages where the kernel
    allows them (madvise), so that receiving into a fresh buffer faults 2 MB pages instead of 4 KB ones
    (fresh buffers filled about twice as fast here). The tensor keeps the mapping alive."""
    if device.type != "cpu" or nbytes < _HUGE_PAGE:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(mapping, dtype=torch.uint8)


def _pack(buffer: torch.Tensor, bucket: Bucket, tensors: dict[str, torch.Tensor], piece: Piece) -> None:
    """Copy the tensors that lie in `piece` into their places in the bucket's `buffer`.

    On CPU a plain single-threaded memmove: torch's `copy_` splits even a 256 KB copy across its intra-op
    threads, and on a busy machine each hand-off can wait for a time slice (packing 64 LoRA tensors took
    ~100 ms instead of ~3 ms here); the other cores are busy with the socket copies anyway.
    """
    for spec, offset in zip(bucket.specs, bucket.offsets):
        if spec.nbytes and piece.start <= offset < piece.end:
            source, target = tensors[spec.name], buffer[offset : offset + spec.nbytes]
            if buffer.device.type == "cpu" and source.device.type == "cpu":
                source = source.contiguous()
                ctypes.memmove(target.data_ptr(), source.data_ptr(), spec.nbytes)
            else:
                view_in(buffer, spec, offset).copy_(source)
