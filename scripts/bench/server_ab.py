"""Two (or more) `tx serve` trees on the peer step, alternating step by step in one run: an A/B of server code.

Each side is a source tree (a git worktree: main's, a branch's) run as its own `tx serve` on the same tiny Qwen3
(peer.py's workload: 8 x 64 tokens, LoRA rank 8, forward_backward + optim_step sent, then both awaited); the
client takes one step on each side in turn, so load drifts on a shared machine hit every side alike. Prints
JSON: each side's median, p25 and min step, the server's CPU per step, split by thread (named from `py-spy
dump` when py-spy is installed: the training thread, its OpenMP worker, the event loop `MainThread`, the AnyIO
worker that decodes and queues, the metrics recorder), and the load average before and after.

    python scripts/bench/server_ab.py --side main=/work/main --side branch=. [--steps 80] [--warmup 5]

A side may set environment variables for its server: `--side name=tree,VAR:value,...`. `--bare` adds a side
that makes the same calls in this process, no server (this tree's backend, `--bare-threads` threads, the
environment `tx serve` gives its trainer). Each side also reports its trainer's own seconds per call
(`trainer_ms`: a server's from its metrics rows, the bare side's timed around each call), so the server's
cost on the pass itself is read against the bare pass of the same minutes, and each server side where its
steps' time went (`step_ms`, medians: until `forward_backward` is queued, queued, the pass, until `optim_step`
runs, its run, and until the client has both results; from the client's step spans and the run's session
trace).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from tx.cpu import usable_cores, use_cpu_defaults

use_cpu_defaults()  # the bare side's trainer gets what `tx serve` gives its own (before torch loads)
import tinker  # noqa: E402
from tinker import types  # noqa: E402

from tx.optimizers import AdamParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import backend_batch, bare_backend, batch, shared_model  # noqa: E402
from txserver import API_KEY, TxServer  # noqa: E402

CALLS = ("forward_backward", "optim_step")

TICK = os.sysconf("SC_CLK_TCK")


def parse_side(spec: str) -> tuple[str, dict[str, str]]:
    name, _, rest = spec.partition("=")
    tree, *variables = rest.split(",")
    env = {"PYTHONPATH": str(Path(tree).resolve())}
    env.update(dict(v.split(":", 1) for v in variables))
    return name, env


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of `pid`, by thread id."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def thread_names(pid: int) -> dict[str, str]:
    """Thread id -> Python thread name, from `py-spy dump` (empty without py-spy)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {}
    dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, check=False).stdout
    return {str(int(m.group(1), 0)): m.group(2) for m in re.finditer(r'Thread (\S+) \(\w+\): "([^"]+)"', dump)}


@dataclass
class Record:
    """A server side's steps as the client saw them (wall-clock start and end) and its run's trace link."""

    walls: list[tuple[float, float]] = field(default_factory=list)
    trace_url: Callable[[], str] | None = None


def steps(url: str, model_dir: Path, record: Record) -> Iterator[float]:
    """The SDK's steps on the server at `url`: each step's seconds, and its wall-clock span in `record`."""
    client = tinker.ServiceClient(base_url=url, api_key=API_KEY)
    tc = client.create_lora_training_client(str(model_dir), rank=8, seed=0).result()
    rest = tinker.RestClient(base_url=url, api_key=API_KEY)
    record.trace_url = lambda: rest.export_session_trace(tc.model_id.split(":")[0]).result()
    data, adam = batch(), types.AdamParams(learning_rate=1e-4)
    while True:
        wall, start = time.time(), time.perf_counter()
        fb, opt = tc.forward_backward(data, "cross_entropy"), tc.optim_step(adam)
        fb.result()
        opt.result()
        seconds = time.perf_counter() - start
        record.walls.append((wall, wall + seconds))
        yield seconds


def step_breakdown(record: Record, last: int) -> dict[str, float]:
    """Where the last `last` steps' time went, median ms per part, from the client's step spans and the run's
    session trace (the server's queued and run slices of each call): until `forward_backward` is queued,
    queued, its pass, until `optim_step` runs, its run, and from its end until the client has both results."""
    assert record.trace_url is not None
    with urllib.request.urlopen(record.trace_url(), timeout=30) as response:  # a signed link: no key needed
        events = [e for e in json.load(response)["traceEvents"] if e.get("ph") == "X"]
    slices = {name: sorted((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in events if e["name"] == name)
              for name in ("ForwardBackward (queued)", "ForwardBackward", "OptimStep")}
    parts: dict[str, list[float]] = {}
    for start, end in record.walls[-last:]:
        found = [[s for s in spans if start <= s[0] <= end] for spans in slices.values()]
        if not all(found):
            raise RuntimeError(f"the session trace lacks a call of the step at {start:.3f}: {list(slices)}")
        (queued, _), (fb_start, fb_end), (opt_start, opt_end) = (spans[0] for spans in found)
        for part, seconds in (("to_queue", queued - start), ("queued", fb_start - queued),
                              ("forward_backward", fb_end - fb_start), ("to_optim_step", opt_start - fb_end),
                              ("optim_step", opt_end - opt_start), ("to_client", end - opt_end)):
            parts.setdefault(part, []).append(seconds)
    return {part: round(1e3 * statistics.median(s), 2) for part, s in parts.items()}


def bare_steps(model_dir: Path, threads: int, spans: dict[str, list[float]]) -> Iterator[float]:
    """The same calls in this process, no server: each step's seconds, each call's appended to `spans`."""
    backend = bare_backend(model_dir, threads)
    data, adam = backend_batch(), AdamParams(learning_rate=1e-4)
    while True:
        start = time.perf_counter()
        backend.forward_backward("run", data)
        middle = time.perf_counter()
        backend.optim_step("run", adam)
        end = time.perf_counter()
        spans["forward_backward"].append(middle - start)
        spans["optim_step"].append(end - middle)
        yield end - start


def trainer_seconds(data_dir: Path, last: int) -> dict[str, list[float]]:
    """A stopped server's trainer seconds of its `last` calls of each kind, from its metrics rows."""
    query = "SELECT seconds FROM run_metrics WHERE kind = ? ORDER BY rowid"
    with sqlite3.connect(data_dir / "tx.db") as db:
        return {kind: [row[0] for row in db.execute(query, (kind,))][-last:] for kind in CALLS}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--side", action="append", required=True, help="name=tree[,VAR:value...]")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--bare", action="store_true", help="a side making the same calls in this process")
    parser.add_argument("--bare-threads", type=int, default=usable_cores(),
                        help="the bare side's torch threads (default: what a server's trainer takes)")
    opts = parser.parse_args()
    sides = dict(parse_side(spec) for spec in opts.side)
    tmp = Path(tempfile.mkdtemp(prefix="tx-bench-ab-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the model and the servers' data, when this ends
    model_dir = shared_model(tmp / "model")
    os.chdir(tmp)  # `python -m tx.cli` puts its working directory first on sys.path, before each side's tree
    with ExitStack() as stack:
        runs, pids, records = {}, {}, {name: Record() for name in sides}
        for name, env in sides.items():
            server = stack.enter_context(TxServer(tmp / name, args=["--base-model", str(model_dir)], env=env))
            runs[name] = steps(server.url, model_dir, records[name])
            pids[name] = server.proc.pid if server.proc else 0
        bare_spans: dict[str, list[float]] = {kind: [] for kind in CALLS}
        if opts.bare:
            runs["bare"] = bare_steps(model_dir, opts.bare_threads, bare_spans)
        times: dict[str, list[float]] = {name: [] for name in runs}
        load_start = [round(x, 2) for x in os.getloadavg()]
        cpu_start: dict[str, dict[str, float]] = {}
        for index in range(opts.warmup + opts.steps):
            if index == opts.warmup:
                cpu_start = {name: thread_cpu_s(pid) for name, pid in pids.items()}
            for name, run in runs.items():
                seconds = next(run)
                if index >= opts.warmup:
                    times[name].append(seconds)
        report: dict = {"steps": opts.steps, "load_average_start": load_start}
        for name, t in times.items():
            report[name] = {"median_ms": round(1e3 * statistics.median(t), 2),
                            "p25_ms": round(1e3 * statistics.quantiles(t, n=4)[0], 2),
                            "min_ms": round(1e3 * min(t), 2)}
        for name, pid in pids.items():
            before, names = cpu_start[name], thread_names(pid)
            used = {tid: (s - before.get(tid, 0.0)) * 1e3 / opts.steps for tid, s in thread_cpu_s(pid).items()}
            busiest = sorted(((names.get(t, t), ms) for t, ms in used.items() if ms > 0), key=lambda x: -x[1])
            report[name].update(server_cpu_ms_per_step=round(sum(used.values()), 2),
                                threads_cpu_ms_per_step={n: round(ms, 2) for n, ms in busiest[:6]})
            report[name]["step_ms"] = step_breakdown(records[name], opts.steps)
        report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    spans = {name: trainer_seconds(tmp / name, opts.steps) for name in pids}  # servers stopped: rows written
    if opts.bare:
        spans["bare"] = {kind: seconds[-opts.steps:] for kind, seconds in bare_spans.items()}
    for name, kinds in spans.items():
        report[name]["trainer_ms"] = {kind: round(1e3 * statistics.median(s), 2)
                                      for kind, s in kinds.items() if s}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
