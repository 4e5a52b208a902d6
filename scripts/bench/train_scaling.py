"""Trainer workers: tokens/s of the in-process trainer against N trainer workers (FSDP2), side by side.

On a CPU machine this measures the workers' overhead at equal compute: 1 trainer x C threads against N workers
x C/N threads (C = the cores, or --threads), target ratio >= 0.8. On a machine with N GPUs it measures scaling:
the trainer on 1 GPU against N workers on one GPU each. Steps alternate between the two, so load from other
processes hits both alike; medians are reported. Prints JSON.
Usage: python scripts/bench/train_scaling.py [--workers 2] [--steps 8] [--batch 8] [--seq-len 128]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tx.backends.torch.backend import TorchBackend
from tx.backends.torch.workers import create_workers_backend
from tx.models import write_tiny_text_model
from tx.types import AdamParams, Datum, ForwardBackwardInput, LoraConfig, ModelInput

LORA = LoraConfig(rank=8, seed=0)
ADAM = AdamParams(learning_rate=1e-4)


def make_batch(batch: int, seq_len: int, vocab: int) -> ForwardBackwardInput:
    tokens = np.random.default_rng(0).integers(0, vocab - 100, size=(batch, seq_len + 1))
    data = [
        Datum(
            ModelInput.from_tokens(row[:-1].tolist()),
            {"target_tokens": row[1:].astype(np.int64), "weights": np.ones(seq_len, np.float32)},
        )
        for row in tokens
    ]
    return ForwardBackwardInput(data, "cross_entropy")


def timed_step(backend, model_id: str, batch: ForwardBackwardInput) -> float:
    start = time.perf_counter()
    backend.forward_backward(model_id, batch)
    backend.optim_step(model_id, ADAM)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="CPU threads in all (CPU only)"
    )
    args = parser.parse_args()
    gpu = torch.cuda.device_count() >= args.workers
    with tempfile.TemporaryDirectory() as tmp:
        models = {"bench": write_tiny_text_model(Path(tmp) / "bench", preset="bench")}
        vocab = TorchBackend(models, device="cpu").base_model_info("bench").vocab_size
        batch = make_batch(args.batch, args.seq_len, vocab)
        if not gpu:
            torch.set_num_threads(args.threads)
        one = TorchBackend(models, device="cuda:0" if gpu else "cpu")
        many = create_workers_backend(
            models,
            args.workers,
            device="cuda" if gpu else "cpu",
            threads=0 if gpu else max(1, args.threads // args.workers),
        )
        try:
            one.create_model("one", "bench", LORA)
            many.create_model("many", "bench", LORA)
            times: dict[str, list[float]] = {"one": [], "many": []}
            for step in range(args.warmup + args.steps):
                for name, backend in (("one", one), ("many", many)):
                    elapsed = timed_step(backend, name, batch)
                    if step >= args.warmup:
                        times[name].append(elapsed)
        finally:
            many.close()
    tokens = args.batch * args.seq_len
    rate = {name: tokens / statistics.median(values) for name, values in times.items()}
    per_worker = "1 GPU each" if gpu else f"{max(1, args.threads // args.workers)} threads each"
    print(
        json.dumps(
            {
                "model": "bench (tx models make-tiny --preset bench, ~21M parameters)",
                "batch": f"{args.batch} x {args.seq_len} tokens, LoRA rank {LORA.rank}",
                "device": torch.cuda.get_device_name(0) if gpu else f"cpu, {args.threads} threads in all",
                "in_process": {
                    "workers": 1,
                    "resources": "1 GPU" if gpu else f"{args.threads} threads",
                    "tokens_per_s": round(rate["one"], 1),
                    "median_step_s": round(statistics.median(times["one"]), 4),
                },
                "workers": {
                    "workers": args.workers,
                    "resources": per_worker,
                    "tokens_per_s": round(rate["many"], 1),
                    "median_step_s": round(statistics.median(times["many"]), 4),
                },
                "ratio": round(rate["many"] / rate["one"], 3),
                "target": ">= 0.8 on CPU (overhead at equal compute); on GPUs, scaling",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
