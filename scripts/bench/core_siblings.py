"""Does work on another CPU slow the training pass? The peer workload's pass beside a load on a second CPU.

The peer workload (`peer.py`: tiny Qwen3, 8 datums of 64 tokens, LoRA rank 8, cross_entropy) as the torch
backend runs it, forward_backward + optim_step, one thread, this process pinned to one CPU; a second
process pinned to another CPU runs one of the loads below, or nothing (`idle`). On a machine whose CPUs are
cores of their own, a load elsewhere leaves the pass alone; where two virtual CPUs share one physical core
(hyperthreads, or a VM's vCPUs placed on them), a busy sibling slows every op of the pass. The loads run
throughout, paused (SIGSTOP) except during their own steps, and take turns step by step, so drifts of a
shared machine hit them alike (runs minutes apart differ more than any load does on this box:
docs/operations.md#the-training-steps-overhead). Prints JSON: per load the median, p25 and p75 ms per step
and the median's ratio to `idle`'s, the CPUs used and the load average.

Usage: python scripts/bench/core_siblings.py [--steps 60] [--pass-cpu N] [--load-cpu M]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tx.cpu import cpu_ids, use_cpu_defaults

use_cpu_defaults()  # the environment `tx serve` gives its trainer (before torch loads)
from peer import backend_batch, bare_backend  # noqa: E402

from tx.models import write_tiny_text_model  # noqa: E402
from tx.optimizers import AdamParams  # noqa: E402

# Each load runs in its own process, one thread, until killed.
LOADS = {
    "idle": None,
    "python_loop": "while True: pass",
    "matmul": "import numpy as np\na = np.ones((256, 256), np.float32)\nwhile True: a @ a",
    "copy_256k": "import numpy as np\na = np.ones(256 << 10, np.uint8); b = np.empty_like(a)\n"
                 "while True: np.copyto(b, a)",
}
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def start_load(code: str, cpu: int) -> subprocess.Popen:
    pinned = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\n{code}"
    return subprocess.Popen([sys.executable, "-c", pinned], env={**os.environ, **ONE_THREAD})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60, help="steps per load")
    parser.add_argument("--pass-cpu", type=int, help="the CPU of the pass (default: this process's last)")
    parser.add_argument("--load-cpu", type=int, help="the CPU of the load (default: the one before it)")
    args = parser.parse_args()
    cpus = cpu_ids()
    if len(cpus) < 2:
        print(json.dumps({"skipped": f"needs two CPUs, this process may run on {cpus}"}))
        return
    pass_cpu = cpus[-1] if args.pass_cpu is None else args.pass_cpu
    load_cpu = cpus[-2] if args.load_cpu is None else args.load_cpu
    os.sched_setaffinity(0, {pass_cpu})  # before torch's thread pool starts: every thread of this process
    tmp = tempfile.mkdtemp(prefix="tx-bench-siblings-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    backend = bare_backend(write_tiny_text_model(Path(tmp) / "model", preset="tiny"), 1)
    batch = backend_batch()
    adam = AdamParams(learning_rate=1e-4)

    def step_ms() -> float:  # the step's wall time, ms
        start = time.perf_counter()
        backend.forward_backward("run", batch)
        backend.optim_step("run", adam)
        return (time.perf_counter() - start) * 1e3

    loads = {name: start_load(code, load_cpu) for name, code in LOADS.items() if code}
    try:
        time.sleep(1.0)  # their imports
        for load in loads.values():
            load.send_signal(signal.SIGSTOP)
        for _ in range(5):
            step_ms()
        load_start = os.getloadavg()
        steps: dict[str, list[float]] = {name: [] for name in LOADS}
        for _ in range(args.steps):
            for name in LOADS:  # step by step: the machine's drifts hit every load alike
                load = loads.get(name)
                if load is not None:
                    load.send_signal(signal.SIGCONT)
                steps[name].append(step_ms())
                if load is not None:
                    load.send_signal(signal.SIGSTOP)
    finally:
        for load in loads.values():
            load.kill()
            load.wait()
    idle = statistics.median(steps["idle"])
    print(json.dumps({
        "workload": "peer pass: 8 x 64 tokens, tiny Qwen3, LoRA rank 8, forward_backward + optim_step",
        "threads": 1,
        "pass_cpu": pass_cpu, "load_cpu": load_cpu,
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "loads": {name: summary(values, idle) for name, values in steps.items()},
    }, indent=1))


def summary(values: list[float], idle: float) -> dict:
    quartiles = statistics.quantiles(values, n=4)
    return {"step_ms_median": round(statistics.median(values), 2), "step_ms_p25": round(quartiles[0], 2),
            "step_ms_p75": round(quartiles[2], 2), "vs_idle": round(statistics.median(values) / idle, 3)}


if __name__ == "__main__":
    main()
