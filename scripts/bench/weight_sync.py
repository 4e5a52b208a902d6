"""Benchmark the weight transfer: GB/s of sending N MB to one receiver process, against a memcpy.

For each transport that can run here (gloo always; nccl with two GPUs; cuda_ipc with one), the sender lives in
this process and the receiver in a spawned one. Each size is measured in three receive modes:
- `fresh`: `receive()` as engines call it (a new buffer per bucket; every yielded tensor stays valid, so at the
  end all tensors exist in their final form);
- `load`: `receive(reuse_buffers=True)` plus a copy of each tensor into a preallocated parameter, as an
  engine's load does (final form: the parameters);
- `direct`: `receive(reuse_buffers=True, targets=parameters)`: tensors sent as pieces of their own land
  straight in the preallocated parameters (no copy); the others are copied as in `load`.
A transfer counts from the start of `send` to the later of the sender's return and the receiver's last byte in
its final form (time.monotonic is shared by processes on Linux). Each repeat runs, back to back, the memcpy
baseline, a raw TCP socket ceiling and the transfer, so all see the same machine load; the first repeat warms
up and is dropped; figures are medians. The baseline copies the same bytes into a preallocated, warmed buffer
on the sender's device, both as torch `copy_` (intra-op threads) and, on CPU, one `memmove`; per repeat the
faster of the two counts. The ceiling (gloo only) sends the same bytes over loopback TCP sockets between the
same two processes (`sendall` of a warm buffer, `recv_into` a warm preallocated one; 1 and 2 connections):
gloo moves bytes the same way, so the ratio cannot pass it by much. Prints one JSON object.

    python scripts/bench/weight_sync.py [--mb 16,256] [--bucket-mb 64] [--iters 7] [--modes fresh,load]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import socket
import statistics
import threading
import time

import torch

from tx.inference.weight_sync import (
    BroadcastReceiver,
    BroadcastSender,
    IpcReceiver,
    IpcSender,
    IpcUpdate,
    TransferInit,
    TransferUpdate,
    free_port,
    plan_update,
)

SOCKET_STREAMS = (1, 2)


def _receiver(transport: str, init_json: str | None, device: str, jobs: mp.Queue, done: mp.Queue) -> None:
    """Serve jobs: ("transfer", mode, update_json) or ("socket", nbytes, streams); report each end time."""
    params: dict[str, torch.Tensor] = {}
    if transport == "cuda_ipc":
        torch.cuda.set_device(torch.device(device))
        receiver = IpcReceiver(torch.device(device))
        while (job := jobs.get()) is not None:
            _consume(receiver.receive(IpcUpdate.model_validate_json(job[2])), params, "load")
            torch.cuda.synchronize()
            done.put(time.monotonic())
        return
    init = TransferInit.model_validate_json(init_json)
    receiver = BroadcastReceiver(init, rank=1, device=torch.device(device))
    listener = socket.create_server(("127.0.0.1", 0))
    done.put(listener.getsockname()[1])
    conns = [listener.accept()[0] for _ in range(max(SOCKET_STREAMS))]
    receiver.connect()
    done.put(time.monotonic())
    sink = None
    while (job := jobs.get()) is not None:
        if job[0] == "socket":
            nbytes, streams = job[1], job[2]
            if sink is None or sink.numel() != nbytes:
                sink = torch.ones(nbytes, dtype=torch.uint8)  # preallocated and faulted in, like memcpy's dst
            parts = sink.chunk(streams)
            threads = [threading.Thread(target=_recv_into, args=(c, p)) for c, p in zip(conns, parts)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:
            mode, update = job[1], TransferUpdate.model_validate_json(job[2])
            targets = _targets(update, params) if mode == "direct" else None
            received = receiver.receive(update, reuse_buffers=mode != "fresh", targets=targets)
            kept = _consume(received, params, mode)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            del kept
        done.put(time.monotonic())
    receiver.close()


def _recv_into(conn: socket.socket, part: torch.Tensor) -> None:
    view, got = memoryview(part.numpy()), 0
    while got < len(view):
        got += conn.recv_into(view[got:])


def _targets(update: TransferUpdate, params: dict) -> dict[str, torch.Tensor]:
    """The preallocated parameters of `update`'s tensors (none on the first push)."""
    found = {spec.name: params.get((spec.name, tuple(spec.shape))) for spec in update.tensors}
    return {name: tensor for name, tensor in found.items() if tensor is not None}


def _consume(received, params: dict, mode: str) -> list:
    """`fresh`: keep every yielded tensor (all valid at the end); `load` and `direct`: copy each into its
    parameter (unless it landed there already)."""
    kept = []
    for name, tensor in received:
        if mode != "fresh":
            key = (name, tuple(tensor.shape))
            if params.get(key) is tensor:
                continue
            if key not in params:
                params[key] = torch.empty_like(tensor)
                params[key].copy_(tensor)  # the first push faults the parameter in (engines load weights once)
            params[key].copy_(tensor)
        else:
            kept.append(tensor)
    return kept


def _make_weights(mb: int, tensor_mb: float, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    numel = int(tensor_mb * (1 << 20)) // 4
    return [(f"layer.{i}.weight", torch.randn(numel, device=device)) for i in range(int(mb / tensor_mb))]


def _tensor_mb(args: argparse.Namespace, mb: int) -> float:
    """LoRA-sized pushes (<= 32 MB) as 256 KB tensors (rank 16 x 4096 x fp32), larger ones as 16 MB tensors."""
    return args.tensor_mb or (0.25 if mb <= 32 else 16.0)


class Memcpy:
    """The baseline: the same bytes copied into a preallocated, warmed buffer on the sender's device."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.device = device
        self.nbytes = nbytes
        self.src = torch.randn(nbytes // 4, device=device).view(torch.uint8)
        self.dst = torch.empty_like(self.src)
        self.dst.copy_(self.src)
        self.times: list[float] = []

    def run(self) -> None:
        """torch `copy_` and (on CPU) one single-threaded memmove; the faster counts."""
        _sync(self.device)
        start = time.monotonic()
        self.dst.copy_(self.src)
        _sync(self.device)
        best = time.monotonic() - start
        if self.device.type == "cpu":
            start = time.monotonic()
            ctypes.memmove(self.dst.data_ptr(), self.src.data_ptr(), self.nbytes)
            best = min(best, time.monotonic() - start)
        self.times.append(best)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(jobs: mp.Queue, job: tuple, done: mp.Queue, run, *run_args) -> float:
    jobs.put(job)
    time.sleep(0.1)  # let the receiver post its first receive
    start = time.monotonic()
    run(*run_args)
    sent = time.monotonic()
    return max(sent, done.get(timeout=300)) - start


def _bench_broadcast(backend: str, args: argparse.Namespace, send_dev: str, recv_dev: str) -> dict:
    ctx = mp.get_context("spawn")
    init = TransferInit(
        backend=backend, master_address="127.0.0.1", master_port=free_port(), world_size=2, rank_offset=1,
        group_name=f"bench-{backend}", timeout_s=120,
    )
    jobs, done = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(backend, init.model_dump_json(), recv_dev, jobs, done))
    proc.start()
    port = done.get(timeout=120)
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(max(SOCKET_STREAMS))]
    sender = BroadcastSender(init, device=torch.device(send_dev))
    sender.connect()
    done.get(timeout=120)
    results = {}
    for mb in args.mb:
        named = _make_weights(mb, _tensor_mb(args, mb), torch.device(send_dev))
        update = plan_update(named, args.bucket_mb << 20)
        memcpy = Memcpy(mb << 20, torch.device(send_dev))
        times: dict[str, list[float]] = {mode: [] for mode in args.modes}
        sockets: dict[int, list[float]] = {n: [] for n in SOCKET_STREAMS}
        for _ in range(args.iters + 1):  # the first run warms up
            memcpy.run()
            if backend == "gloo":
                for streams in SOCKET_STREAMS:
                    sockets[streams].append(_timed(
                        jobs, ("socket", mb << 20, streams), done, _send_socket, conns[:streams], memcpy.src))
            for mode in args.modes:
                times[mode].append(_timed(
                    jobs, ("transfer", mode, update.model_dump_json()), done, _send, sender, named, update))
        entry = {"tensor_mb": _tensor_mb(args, mb), "tensors": len(named),
                 "memcpy_gb_per_s": _gbps(mb, memcpy.times)}
        for mode, mode_times in times.items():
            entry[mode] = _result(mb, mode_times, memcpy)
        if backend == "gloo":
            entry["socket_ceiling"] = {f"{n}_streams": _result(mb, sockets[n], memcpy) for n in SOCKET_STREAMS}
        results[f"{mb}mb"] = entry
    jobs.put(None)
    proc.join(60)
    sender.close()
    for conn in conns:
        conn.close()
    return results


def _send(sender: BroadcastSender, named: list, update: TransferUpdate) -> None:
    sender.send(named, update)
    _sync(sender.device)


def _send_socket(conns: list[socket.socket], src: torch.Tensor) -> None:
    parts = src.chunk(len(conns))
    threads = [threading.Thread(target=c.sendall, args=(memoryview(p.numpy()),)) for c, p in zip(conns, parts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _bench_ipc(args: argparse.Namespace) -> dict:
    ctx = mp.get_context("spawn")
    jobs, done = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=("cuda_ipc", None, "cuda:0", jobs, done))
    proc.start()
    device = torch.device("cuda:0")
    sender = IpcSender(device)
    results = {}
    for mb in args.mb:
        named = _make_weights(mb, _tensor_mb(args, mb), device)
        memcpy = Memcpy(mb << 20, device)
        times = []
        for _ in range(args.iters + 1):
            memcpy.run()
            start = time.monotonic()
            update = sender.share(named, args.bucket_mb << 20)
            jobs.put(("transfer", "load", update.model_dump_json()))
            received = done.get(timeout=300)
            sender.release()
            times.append(received - start)
        results[f"{mb}mb"] = {"load": _result(mb, times, memcpy)}
    jobs.put(None)
    proc.join(60)
    return results


def _gbps(mb: int, times: list[float]) -> float:
    return round((mb << 20) / statistics.median(times[1:]) / 1e9, 3)


def _result(mb: int, times: list[float], memcpy: Memcpy) -> dict:
    ratios = [m / t for m, t in zip(memcpy.times[1:], times[1:])]
    return {
        "seconds": round(statistics.median(times[1:]), 4),
        "gb_per_s": _gbps(mb, times),
        "ratio": round(statistics.median(ratios), 3),
        "ratio_per_run": [round(r, 3) for r in ratios],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", default="16,256", help="megabytes sent per transfer, comma separated")
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--tensor-mb", type=float, default=None,
                        help="size of each float32 tensor (default: 0.25 for <= 32 MB pushes, else 16)")
    parser.add_argument("--iters", type=int, default=7, help="timed transfers (after one warm-up)")
    parser.add_argument("--transports", default="gloo,nccl,cuda_ipc")
    parser.add_argument("--modes", default="fresh,load,direct", help="receive modes: fresh (receive() as "
                        "engines call it), load (reuse_buffers=True plus a copy into preallocated parameters), "
                        "direct (received straight into the preallocated parameters)")
    args = parser.parse_args()
    args.mb = [int(mb) for mb in args.mb.split(",")]
    args.modes = args.modes.split(",")
    wanted = args.transports.split(",")
    results: dict = {"mb": args.mb, "bucket_mb": args.bucket_mb, "dtype": "float32", "iters": args.iters,
                     "ratio": "transfer GB/s / memcpy GB/s, median over repeats", "transports": {}}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if "gloo" in wanted:
        results["transports"]["gloo"] = _bench_broadcast("gloo", args, "cpu", "cpu")
    if "nccl" in wanted and gpus >= 2:
        results["transports"]["nccl"] = _bench_broadcast("nccl", args, "cuda:0", "cuda:1")
    if "cuda_ipc" in wanted and gpus >= 1:
        results["transports"]["cuda_ipc"] = _bench_ipc(args)
    skipped = [name for name in wanted if name not in results["transports"]]
    if skipped:
        results["skipped"] = {name: f"needs {'2 GPUs' if name == 'nccl' else 'a GPU'}" for name in skipped}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
