"""Where a vLLM child runs, as its engine's `/health` reports it: device, GPU, host, the weight transports it
can take and how many ranks join a transfer group (its tensor-parallel workers)."""

from __future__ import annotations

import socket

from tx.inference.engines.vllm.config import VllmEngineConfig
from tx.inference.weight_sync import Transport, cuda_device_uuid


def placement(config: VllmEngineConfig) -> dict:
    """Device, GPU UUID, host and weight transports of the vLLM child. Its first worker runs on the first GPU
    it sees, which is this process's cuda:0 unless `extra_env` sets another CUDA_VISIBLE_DEVICES (then the
    UUID is unknown). CUDA IPC needs every worker on the trainer's GPU: one worker (no tensor parallelism)."""
    import torch

    hostname, workers = socket.gethostname(), tensor_parallel_size(config.extra_args)
    if not torch.cuda.is_available():  # vLLM's CPU build
        return {"device": "cpu", "gpu_uuid": None, "hostname": hostname, "weight_transports": ["gloo"],
                "transfer_ranks": workers}
    gpu_uuid = None if "CUDA_VISIBLE_DEVICES" in config.extra_env else cuda_device_uuid(0)
    transports: list[Transport] = ["gloo", "nccl"]
    if workers == 1:
        transports.append("ipc")
    return {"device": "cuda:0", "gpu_uuid": gpu_uuid, "hostname": hostname, "weight_transports": transports,
            "transfer_ranks": workers}


def tensor_parallel_size(args: list[str]) -> int:
    """The tensor-parallel size `vllm serve`'s extra arguments ask for (1 by default)."""
    size = 1
    for i, arg in enumerate(args):
        if arg in ("--tensor-parallel-size", "-tp") and i + 1 < len(args):
            size = int(args[i + 1])
        elif arg.startswith("--tensor-parallel-size="):
            size = int(arg.split("=", 1)[1])
    return size
