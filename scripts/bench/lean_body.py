"""The body's LoRA layers lean (`tx/backends/torch/lean_body.py`) against PEFT's forward, in one process.

The peer workload (`peer.py`: tiny Qwen3, 8 datums of 64 tokens, LoRA rank 8, cross_entropy) as the torch
backend runs it, forward_backward + optim_step, the two sides alternating step by step on one run (so a busy
machine slows both alike). Prints JSON: per side the min and median ms per step, their ratio, the load average.
Usage: python scripts/bench/lean_body.py [--steps 40] [--threads 1] [--seq-len 64] [--batch 8]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tx.cpu import use_cpu_defaults

use_cpu_defaults()  # the environment `tx serve` gives its trainer (before torch loads)
from peer import backend_batch, bare_backend  # noqa: E402

import tx.backends.torch.step as step  # noqa: E402
from tx.models import write_tiny_text_model  # noqa: E402
from tx.optimizers import AdamParams  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="tx-bench-lean-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    model_dir = write_tiny_text_model(Path(tmp) / "model", preset="tiny")
    backend = bare_backend(model_dir, args.threads)
    batch = backend_batch(args.batch, args.seq_len)
    adam = AdamParams(learning_rate=1e-4)
    lean = step.lean_linears
    sides = {"peft": lambda *a: contextlib.nullcontext(), "lean": lean}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for index in range(3 + args.steps):
        for name, linears in sides.items():
            step.lean_linears = linears
            start = time.perf_counter()
            backend.forward_backward("run", batch)
            backend.optim_step("run", adam)
            if index >= 3:  # warm-up steps left out
                times[name].append(time.perf_counter() - start)
    step.lean_linears = lean
    out: dict[str, object] = {
        name: {"min_ms": round(min(t) * 1e3, 2), "median_ms": round(statistics.median(t) * 1e3, 2)}
        for name, t in times.items()
    }
    out["median_ratio"] = round(statistics.median(times["peft"]) / statistics.median(times["lean"]), 3)
    out["min_ratio"] = round(min(times["peft"]) / min(times["lean"]), 3)
    out.update(steps=args.steps, threads=args.threads, load=round(os.getloadavg()[0], 2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
