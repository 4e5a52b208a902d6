"""Transfer groups built without the global default process group, and small networking helpers.

A group is a rendezvous store (hosted by rank 0 behind the group's token, `rendezvous.py`; never torch's
TCPStore, which listens on every interface and answers anyone) -> PrefixStore(group_name) ->
ProcessGroupGloo or ProcessGroupNCCL.
Nothing touches `torch.distributed.init_process_group`, so a process can hold any number of groups next to
whatever else it runs.
"""

from __future__ import annotations

import contextlib
import os
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # where torch defines them (torch.distributed re-exports them without marking it)
    from torch._C._distributed_c10d import Store

from tx.inference.weight_sync.rendezvous import RemoteStore, StoreServer
from tx.inference.weight_sync.transport import local_address_towards
from tx.inference.weight_sync.types import TransferInit, WeightSyncError


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral TCP port that is free right now on `host` (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# Gloo over TCP moves one tensor on one stream; broadcasts in flight at once (pieces, and chunks of pieces over
# 16 MB) go over several gloo devices (one TCP pair each) and worker threads: ~1.7x loopback throughput here
# (smaller chunks cost more per byte than they gain).
GLOO_STREAMS = 4
GLOO_DEVICES = 2
MIN_CHUNK_BYTES = 16 << 20


class _Backend(Protocol):
    """The c10d backend calls a group makes. ProcessGroupGloo and ProcessGroupNCCL (c10d `Backend`s, not
    `ProcessGroup`s) have them all at runtime, but torch's stubs omit `Backend.broadcast`."""

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> dist.Work: ...

    def abort(self) -> None: ...

    def shutdown(self) -> None: ...


class TransferGroup:
    """One rank's membership in a transfer group: broadcasts from rank 0 with a timeout on each."""

    def __init__(self, init: TransferInit, rank: int) -> None:
        if not 0 <= rank < init.world_size:
            raise ValueError(f"rank {rank} outside world of size {init.world_size}")
        self.init = init
        self.rank = rank
        self.timeout = timedelta(seconds=init.timeout_s)
        self._server: StoreServer | None = None  # rank 0
        self._remote: RemoteStore | None = None  # other ranks
        self._backend: _Backend | None = None

    def join(self, device: torch.device) -> None:
        """Rendezvous with every rank, then run one tiny broadcast so that joining means working."""
        init = self.init
        try:
            store = dist.PrefixStore(init.group_name, self._rendezvous())  # pyright: ignore[reportPrivateImportUsage]
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                self._backend = _make_backend(init, store, self.rank, self.timeout)
                self.broadcast(torch.zeros(1, dtype=torch.uint8, device=device))
        except Exception as exc:
            self.close(abort=True)
            raise WeightSyncError(
                f"rank {self.rank} could not join transfer group {init.group_name!r} ({init.backend}, "
                f"world {init.world_size}, store {init.master_address}:{init.master_port}) "
                f"within {init.timeout_s:g}s: {exc}"
            ) from exc

    def _rendezvous(self) -> Store:
        """Rank 0: host the group's store on (master_address, master_port); others: connect to it."""
        init = self.init
        if self.rank == 0:
            self._server = StoreServer(init.master_address, init.master_port, init.store_token, self.timeout)
            return self._server.store
        self._remote = RemoteStore(init.master_address, init.master_port, init.store_token, self.timeout)
        return self._remote

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast `tensor` from rank 0 and wait for it."""
        self.wait(self.start_broadcast(tensor))

    def start_broadcast(self, tensor: torch.Tensor) -> list[dist.Work]:
        """Start broadcasting the flat `tensor` from rank 0 (chunks in parallel on gloo); then `wait`."""
        if self._backend is None:
            raise WeightSyncError(f"transfer group {self.init.group_name!r} is not connected")
        return [self._backend.broadcast([chunk], self._options()) for chunk in self._chunks(tensor)]

    def wait(self, works: list[dist.Work]) -> None:
        """Wait for every chunk; a failure or timeout breaks the group (it is aborted) and raises."""
        for work in works:
            try:
                done = work.wait(self.timeout)
            except Exception as exc:
                self.close(abort=True)
                raise WeightSyncError(f"broadcast in group {self.init.group_name!r} failed: {exc}") from exc
            if not done:
                self.close(abort=True)
                raise WeightSyncError(
                    f"broadcast in group {self.init.group_name!r} timed out after {self.init.timeout_s:g}s"
                )

    def _chunks(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if self.init.backend != "gloo":
            return [tensor]
        count = max(1, min(GLOO_STREAMS, tensor.numel() * tensor.element_size() // MIN_CHUNK_BYTES))
        return list(tensor.chunk(count))

    def _options(self) -> dist.BroadcastOptions:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        opts.timeout = self.timeout
        return opts

    def close(self, abort: bool = False) -> None:
        """Leave the group (abort: without flushing, after a failure); idempotent."""
        backend, self._backend = self._backend, None
        server, remote, self._server, self._remote = self._server, self._remote, None, None
        if backend is not None:
            try:
                backend.abort() if abort else backend.shutdown()
            except Exception:  # tearing down a broken group must not mask the original error
                pass
        if server is not None:
            server.close()
        if remote is not None:
            remote.close()


def _make_backend(
    init: TransferInit, store: Store, rank: int, timeout: timedelta
) -> _Backend:
    if init.backend == "gloo":
        options = dist.ProcessGroupGloo._Options()  # pyright: ignore[reportAttributeAccessIssue]  (not in torch's stubs)
        options._timeout = timeout
        options._devices = [_gloo_device(init.master_address) for _ in range(GLOO_DEVICES)]
        options._threads = GLOO_STREAMS
        return cast(_Backend, dist.ProcessGroupGloo(store, rank, init.world_size, options))  # stubs lack broadcast
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    if nccl is None or not torch.cuda.is_available():
        raise WeightSyncError("backend 'nccl' needs a CUDA build of torch and a GPU; use 'gloo' on CPU")
    options = nccl.Options()
    # NCCL's watchdog tears the whole process down when its own timeout fires; ours (Work.wait) fires first
    # and aborts the group, so a stuck engine raises WeightSyncError in the trainer instead.
    options._timeout = timeout * 2 + timedelta(seconds=30)
    return nccl(store, rank, init.world_size, options)


def _gloo_device(master_address: str) -> dist.ProcessGroupGloo.Device:
    """The gloo device on the interface that reaches the master (GLOO_SOCKET_IFNAME wins when set)."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    if interface:
        return dist.ProcessGroupGloo.create_device(interface=interface.split(",")[0])
    try:
        return dist.ProcessGroupGloo.create_device(hostname=local_address_towards(master_address))
    except OSError:  # no route found: let gloo resolve the master's name itself
        return dist.ProcessGroupGloo.create_device(hostname=master_address)
