"""Several runs in one training pass against today's turns, side by side in one run.

N concurrent LoRA runs (rank 8) on one base model, each stepping on its own batch (`--batch` x `--seq-len`
tokens, cross_entropy) then its own AdamW step. Two ways, alternating round by round so load from other jobs
hits both alike:

- "turns": the trainer runs one run's forward_backward at a time (as tx does today), so the k-th run of a
  round waits for the k - 1 before it;
- "shared": every run's forward_backward in one call (`forward_backward_many`: one pass per micro-batch, each
  run's rows through its own adapter, tx/backends/torch/fused.py).

Backend level (in this process, no server): the trainer's own gain, without HTTP. Prints JSON per N: aggregate
trained tokens/s, and the median and worst run's step latency (from the round's start to its optim_step's end);
and trained tokens per CPU second of this process, which other jobs' load moves far less than wall time (with
`--threads 1`, the work each way does).

The model: a tiny preset (default "vocab-h64": Qwen3's vocabulary of 151,936 on a two-layer body, what a
2-core CPU allows at real vocabulary; "bench": the ~21M model of train_step.py), or `--model DIR` (a local
Hugging Face model, for real shapes on an accelerator, `--device cuda`).

    python scripts/bench/shared_pass.py [--runs 1 4 16] [--rounds 2] [--batch 8] [--seq-len 128]
                                        [--preset vocab-h64 | --model DIR] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tx.cpu import use_huge_pages

use_huge_pages()  # as `tx serve` does, before torch loads
import numpy as np
import torch

from tx.backends.torch.backend import TorchBackend
from tx.models import write_tiny_text_model
from tx.optimizers import AdamParams
from tx.types import Datum, ForwardBackwardInput, LoraConfig, ModelInput

ADAM = AdamParams(learning_rate=1e-4)


def batch_of(seed: int, batch: int, seq_len: int, vocab: int) -> ForwardBackwardInput:
    tokens = np.random.default_rng(seed).integers(0, vocab, size=(batch, seq_len + 1))
    data = [Datum(ModelInput.from_tokens(row[:-1].tolist()),
                  {"target_tokens": row[1:].astype(np.int64), "weights": np.ones(seq_len, np.float32)})
            for row in tokens]
    return ForwardBackwardInput(data, "cross_entropy")


def turns(backend: TorchBackend, runs: list[tuple[str, ForwardBackwardInput]]) -> list[float]:
    """Each run's latency from the round's start, one run at a time."""
    start, done = time.perf_counter(), []
    for model_id, batch in runs:
        backend.forward_backward(model_id, batch)
        backend.optim_step(model_id, ADAM)
        done.append(time.perf_counter() - start)
    return done


def shared(backend: TorchBackend, runs: list[tuple[str, ForwardBackwardInput]]) -> list[float]:
    """Each run's latency from the round's start, every forward_backward in one call."""
    start = time.perf_counter()
    results = backend.forward_backward_many(runs)
    assert not any(isinstance(r, Exception) for r in results), results
    done = []
    for model_id, _ in runs:
        backend.optim_step(model_id, ADAM)
        done.append(time.perf_counter() - start)
    return done


def measure(backend: TorchBackend, count: int, args: argparse.Namespace) -> dict[str, Any]:
    vocab = backend.base_model_info("bench").vocab_size
    runs = []
    for i in range(count):
        model_id = f"run-{count}-{i}"
        backend.create_model(model_id, "bench", LoraConfig(rank=8, seed=i))
        runs.append((model_id, batch_of(i, args.batch, args.seq_len, vocab)))
    latencies: dict[str, list[float]] = {"turns": [], "shared": []}
    rounds: dict[str, list[float]] = {"turns": [], "shared": []}
    cpu: dict[str, list[float]] = {"turns": [], "shared": []}  # CPU seconds of this process per round
    shared(backend, runs)  # warm-up (and the model's one check, fusion_check.py)
    turns(backend, runs)
    for _ in range(args.rounds):
        for name, way in (("turns", turns), ("shared", shared)):
            start = time.process_time()
            done = way(backend, runs)
            cpu[name].append(time.process_time() - start)
            latencies[name] += done
            rounds[name].append(done[-1])
    for model_id, _ in runs:
        backend.delete_model(model_id)
    tokens = count * args.batch * args.seq_len
    out: dict[str, Any] = {}
    for name in ("turns", "shared"):
        out[name] = {
            "tokens_per_s": round(tokens / statistics.median(rounds[name]), 1),
            "step_latency_s_median": round(statistics.median(latencies[name]), 3),
            "step_latency_s_worst": round(max(latencies[name]), 3),
            "tokens_per_cpu_s": round(tokens / statistics.median(cpu[name]), 1),
        }
    out["throughput_shared_over_turns"] = round(out["shared"]["tokens_per_s"] / out["turns"]["tokens_per_s"], 2)
    out["tokens_per_cpu_s_shared_over_turns"] = round(
        out["shared"]["tokens_per_cpu_s"] / out["turns"]["tokens_per_cpu_s"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--preset", default="vocab-h64", help="a tiny model preset (tx models make-tiny)")
    parser.add_argument("--model", type=Path, help="a local Hugging Face model directory instead of a preset")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or write_tiny_text_model(Path(tmp) / "model", preset=args.preset)
        backend = TorchBackend({"bench": model_dir}, device=args.device)
        results = {str(count): measure(backend, count, args) for count in args.runs}
        vocab = backend.base_model_info("bench").vocab_size
    print(json.dumps({
        "model": str(args.model) if args.model else args.preset, "vocab": vocab, "device": args.device,
        "batch_per_run": [args.batch, args.seq_len], "rounds": args.rounds, "threads": torch.get_num_threads(),
        "load_avg_1m": round(os.getloadavg()[0], 2), "wall_s": round(time.perf_counter() - started, 1),
        "runs": results,
    }, indent=2))


if __name__ == "__main__":
    main()
