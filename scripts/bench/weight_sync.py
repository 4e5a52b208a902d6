"""Benchmark the weight transfer: GB/s of sending N MB to one receiver process, against a memcpy.

For each transport that can run here (gloo always; nccl with two GPUs; cuda_ipc with one), the sender lives in
this process and the receiver in a spawned one (with --load it also copies each tensor into a preallocated
parameter, as an engine's load does). A transfer counts from the start of `send` to the later of the
sender's return and the receiver's last byte (time.monotonic is shared by processes on Linux). The baseline
is `dst.copy_(src)` of the same bytes on the sender's device. Prints one JSON object.

    python scripts/bench/weight_sync.py [--mb 256] [--bucket-mb 64] [--tensor-mb 16] [--iters 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
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


def _receiver(
    transport: str,
    init_json: str | None,
    device: str,
    load: bool,
    fresh: bool,
    jobs: mp.Queue,
    done: mp.Queue,
) -> None:
    """Receive each job; with `load`, copy every tensor into a preallocated parameter, as an engine does."""
    params: dict[str, torch.Tensor] = {}
    if transport == "cuda_ipc":
        torch.cuda.set_device(torch.device(device))
        receiver = IpcReceiver(torch.device(device))
        while (job := jobs.get()) is not None:
            _consume(receiver.receive(IpcUpdate.model_validate_json(job)), params, load=True)
            torch.cuda.synchronize()
            done.put(time.monotonic())
        return
    init = TransferInit.model_validate_json(init_json)
    receiver = BroadcastReceiver(init, rank=1, device=torch.device(device))
    receiver.connect()
    done.put(time.monotonic())
    while (job := jobs.get()) is not None:
        update = TransferUpdate.model_validate_json(job)
        _consume(receiver.receive(update, reuse_buffers=not fresh), params, load)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        done.put(time.monotonic())
    receiver.close()


def _consume(received, params: dict[str, torch.Tensor], load: bool) -> None:
    for name, tensor in received:
        if load:
            if name not in params:
                params[name] = torch.empty_like(tensor)
            params[name].copy_(tensor)


def _make_weights(mb: int, tensor_mb: int, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    numel = tensor_mb * (1 << 20) // 4
    return [(f"layer.{i}.weight", torch.randn(numel, device=device)) for i in range(mb // tensor_mb)]


class _Memcpy:
    """`dst.copy_(src)` of the transfer's bytes, timed just before each transfer so both see the same load."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.device = device
        self.src = torch.randn(nbytes // 4, device=device)
        self.dst = torch.empty_like(self.src)
        self.times: list[float] = []

    def run(self) -> None:
        _sync(self.device)
        start = time.monotonic()
        self.dst.copy_(self.src)
        _sync(self.device)
        self.times.append(time.monotonic() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bench_broadcast(backend: str, args: argparse.Namespace, send_dev: str, recv_dev: str) -> dict:
    ctx = mp.get_context("spawn")
    init = TransferInit(
        backend=backend, master_address="127.0.0.1", master_port=free_port(), world_size=2, rank_offset=1,
        group_name=f"bench-{backend}", timeout_s=120,
    )
    jobs, done = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(
        target=_receiver,
        args=(backend, init.model_dump_json(), recv_dev, args.load, args.fresh_buffers, jobs, done),
    )
    proc.start()
    sender = BroadcastSender(init, device=torch.device(send_dev))
    sender.connect()
    done.get(timeout=120)
    named = _make_weights(args.mb, args.tensor_mb, torch.device(send_dev))
    update = plan_update(named, args.bucket_mb << 20)
    memcpy = _Memcpy(args.mb << 20, torch.device(send_dev))
    times = []
    for _ in range(args.iters + 1):  # the first run warms up
        memcpy.run()
        jobs.put(update.model_dump_json())
        time.sleep(0.2)  # let the receiver post its first receive
        start = time.monotonic()
        sender.send(named, update)
        _sync(torch.device(send_dev))
        sent = time.monotonic()
        received = done.get(timeout=300)
        times.append(max(sent, received) - start)
    jobs.put(None)
    proc.join(60)
    sender.close()
    return _result(args, times, memcpy)


def _bench_ipc(args: argparse.Namespace) -> dict:
    ctx = mp.get_context("spawn")
    jobs, done = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=("cuda_ipc", None, "cuda:0", True, False, jobs, done))
    proc.start()
    device = torch.device("cuda:0")
    named = _make_weights(args.mb, args.tensor_mb, device)
    sender = IpcSender(device)
    memcpy = _Memcpy(args.mb << 20, device)
    times = []
    for _ in range(args.iters + 1):
        memcpy.run()
        start = time.monotonic()
        update = sender.share(named, args.bucket_mb << 20)
        jobs.put(update.model_dump_json())
        received = done.get(timeout=300)
        sender.release()
        times.append(received - start)
    jobs.put(None)
    proc.join(60)
    return _result(args, times, memcpy)


def _result(args: argparse.Namespace, times: list[float], memcpy: _Memcpy) -> dict:
    nbytes = args.mb << 20
    seconds = statistics.median(times[1:])
    gbps = nbytes / seconds / 1e9
    memcpy_gbps = nbytes / statistics.median(memcpy.times[1:]) / 1e9
    ratios = [m / t for m, t in zip(memcpy.times[1:], times[1:])]
    return {
        "seconds": round(seconds, 4),
        "gb_per_s": round(gbps, 3),
        "memcpy_gb_per_s": round(memcpy_gbps, 3),
        "ratio": round(gbps / memcpy_gbps, 3),
        "ratio_per_run": [round(r, 3) for r in ratios],
        "device": str(memcpy.device),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="megabytes sent per transfer")
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--tensor-mb", type=int, default=16, help="size of each float32 tensor")
    parser.add_argument("--iters", type=int, default=5, help="timed transfers (after one warm-up)")
    parser.add_argument("--transports", default="gloo,nccl,cuda_ipc")
    parser.add_argument("--fresh-buffers", action="store_true", help="receive(reuse_buffers=False), "
                        "the default of BroadcastReceiver.receive: a new buffer per bucket (page faults)")
    parser.add_argument("--load", action="store_true", help="the receiver also copies into its parameters "
                        "(always on for cuda_ipc, where mapping alone moves no bytes)")
    args = parser.parse_args()
    wanted = args.transports.split(",")
    results: dict = {"mb": args.mb, "bucket_mb": args.bucket_mb, "dtype": "float32", "load": args.load,
                     "fresh_buffers": args.fresh_buffers,
                     "transports": {}}
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
