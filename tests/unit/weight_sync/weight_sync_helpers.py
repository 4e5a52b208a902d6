"""Shared helpers for the weight-sync tests: gloo groups on 127.0.0.1 with receivers in subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from tx.inference.weight_sync import TransferInit, TransferUpdate, free_port

RECEIVER_MAIN = Path(__file__).with_name("receiver_main.py")


def make_init(world_size: int = 2, group_name: str = "test", timeout_s: float = 30.0) -> TransferInit:
    return TransferInit(
        backend="gloo",
        master_address="127.0.0.1",
        master_port=free_port(),
        world_size=world_size,
        rank_offset=1,
        group_name=group_name,
        timeout_s=timeout_s,
    )


def mixed_weights(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    """Many tensors of mixed dtypes and shapes, including a scalar, an empty one and a non-contiguous one."""
    gen = torch.Generator().manual_seed(seed)
    weights = []
    for layer in range(6):
        weights.append((f"layers.{layer}.attn.weight", torch.randn(64, 48, generator=gen).to(torch.bfloat16)))
        weights.append((f"layers.{layer}.norm.weight", torch.randn(48, generator=gen)))
        weights.append((f"layers.{layer}.mlp.weight", torch.randn(96, 48, generator=gen).to(torch.float16)))
    weights += [
        ("embed.weight", torch.randn(300, 40, generator=gen)),
        ("step", torch.tensor(7, dtype=torch.int64)),
        ("positions", torch.randint(-(2**40), 2**40, (33,), generator=gen)),
        ("mask", torch.rand(17, generator=gen) > 0.5),
        ("empty", torch.empty(0, 5)),
        ("transposed", torch.randn(20, 30, generator=gen).t()),
        ("double", torch.randn(3, 3, dtype=torch.float64, generator=gen)),
        ("int8", torch.randint(-128, 127, (50,), dtype=torch.int8, generator=gen)),
    ]
    return weights


class ReceiverProcess:
    """One receiver rank in a subprocess, fed its job on stdin."""

    def __init__(
        self,
        tmp_path: Path,
        rank: int,
        groups: list[tuple[TransferInit, TransferUpdate]],
        mode: str = "receive",
    ) -> None:
        self.out = tmp_path / f"rank{rank}"
        job = {
            "rank": rank,
            "out": str(self.out),
            "mode": mode,
            "groups": [{"init": i.model_dump(), "update": u.model_dump()} for i, u in groups],
        }
        self.proc = subprocess.Popen(
            [sys.executable, str(RECEIVER_MAIN)], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.proc.stdin.write(json.dumps(job))
        self.proc.stdin.close()

    def result(self, index: int = 0, timeout: float = 60) -> dict[str, torch.Tensor]:
        self.wait(timeout)
        return torch.load(f"{self.out}.{index}")

    def wait(self, timeout: float = 60) -> None:
        rc = self.proc.wait(timeout)
        stderr = self.proc.stderr.read()
        assert rc == 0, f"receiver failed ({rc}):\n{stderr}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def assert_same(expected: list[tuple[str, torch.Tensor]], received: dict[str, torch.Tensor]) -> None:
    assert list(received) == [name for name, _ in expected]
    for name, tensor in expected:
        got = received[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got, tensor), name
