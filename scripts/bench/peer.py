"""tx against SkyRL's tx (PyPI `skyrl-tx`) on the same SDK workload, side by side in one run (issue 22's table).

The workload, the same client code for both servers (this process's `tinker` SDK), the same tiny Qwen3 directory
(made by tx) and the same seeds. A LoRA run (rank 8, seed 0) starts training `--idle-s` after the server
answered at the earliest (a script's setup time, alike for both: tx's standby engine imports meanwhile, SkyRL's
engine loads its model) and trains `--warmup` + `--steps` turns of two steps of forward_backward + optim_step on
8 x 64 tokens: one pipelined (both calls submitted, then both awaited, as scripts/bench/train_step.py and the
cookbook do: `train_step_s`, the median after the warmup, and its p90), one awaiting each call before the next
(`train_step_awaiting_each_s`, as SkyRL's README example does); `train_step_server_cpu_s` is the CPU seconds the
server's process group used per step over the timed turns (a loaded machine moves it less than wall time).
Then the first `save_weights_and_get_sampling_client()`, and samples of 8 x 64 tokens (temperature 1, seed 0):
the first, and the median of `--samples` more (steady). Each round starts a fresh server of each kind on a free
loopback port, tx first then SkyRL, so load drifts hit both alike. Prints JSON: each side's medians over the
rounds, per-round figures, the ratios the issue's goals name (>= 1: tx ahead), and the load average.

SkyRL 0.3.0 predates the SDK 0.38 wire (protobuf forward_backward bodies and results, `/client/config`, sample
sequence ids): scripts/bench/peer_adapter.py translates in front of it, and passes through in front of tx, so
both get the same extra loopback hop (`--tx-direct` also runs tx without it); its conversions count in SkyRL's
figures. SkyRL pins transformers 4: the
model directory names its tokenizer class, extra special tokens and rope_theta as v4 reads them too
(`shared_model`). SkyRL runs from its own virtualenv (never this one: its package is also called `tx`), given by
`--skyrl-python`; without it the SkyRL side is skipped, with a message. Its API server starts its engine with
`uv run ... -m tx.tinker.engine`; a stand-in `uv` first on that server's PATH runs the same module with
`--skyrl-python`. Setting SkyRL up on CPU (docs/operations.md#benchmarks-against-a-peer):

    python3.11 -m venv /work/skyrl-venv
    /work/skyrl-venv/bin/pip install "skyrl-tx[tinker]==0.3.0" jax==0.10.2 jaxlib==0.10.2 "flax>=0.12.2" \\
        "optax>=0.2.5" tinker==0.38.0 torch==2.13.0

    python scripts/bench/peer.py [--rounds 3] [--skyrl-python /work/skyrl-venv/bin/python] [--tx-direct]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import tinker
import torch
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from txserver import API_KEY, TxServer, free_port, stop_group, wait_healthy  # noqa: E402

from tx.backends.torch.backend import TorchBackend  # noqa: E402
from tx.models import write_tiny_text_model  # noqa: E402
from tx.types import Datum, ForwardBackwardInput, LoraConfig, ModelInput  # noqa: E402

BATCH, SEQ, RANK, SEED = 8, 64, 8, 0
UV_STAND_IN = """#!/bin/sh
# `uv run [options] -m MODULE ARGS` -> SkyRL's python -m MODULE ARGS (the bench's stand-in for uv)
while [ "$#" -gt 0 ] && [ "$1" != "-m" ]; do shift; done
exec "$SKYRL_PYTHON" "$@"
"""


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes of process group `pgid` (a server and what it started),
    from /proc: on a shared machine they move less than wall time."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended meanwhile
        if int(fields[2]) == pgid:  # after the name: state, ppid, pgrp, ..., utime (14th), stime (15th)
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


@contextmanager
def tx_server(model_dir: Path, data_dir: Path) -> Iterator[tuple[str, int]]:
    """`tx serve` as shipped, on the tiny model: (url, process group)."""
    with TxServer(data_dir, args=["--base-model", str(model_dir)]) as server:
        assert server.proc is not None
        yield server.url, server.proc.pid


@contextmanager
def skyrl_server(python: str, model_dir: Path, data_dir: Path) -> Iterator[tuple[str, int]]:
    """SkyRL's API server (`python -m tx.tinker.api`, JAX backend on CPU), cwd and PYTHONPATH away from this tree."""
    data_dir.mkdir(parents=True)
    (data_dir / "bin").mkdir()
    uv = data_dir / "bin" / "uv"
    uv.write_text(UV_STAND_IN)
    uv.chmod(0o755)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{data_dir / 'bin'}:{env.get('PATH', '')}", SKYRL_PYTHON=python, JAX_PLATFORMS="cpu")
    backend = {"max_lora_adapters": 2, "max_lora_rank": RANK}
    cmd = [python, "-m", "tx.tinker.api", "--host", "127.0.0.1", "--port", str(port),
           "--base-model", str(model_dir), "--database-url", f"sqlite:///{data_dir / 'tinker.db'}",
           "--checkpoints-base", str(data_dir / "checkpoints"), "--backend-config", json.dumps(backend)]
    log_path = data_dir / "server.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=data_dir,
                                start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy("SkyRL", f"{url}/api/v1/healthz", proc, 180, lambda: log_path.read_text(errors="replace"))
        yield url, proc.pid
    finally:
        stop_group(proc, 20)


def shared_model(directory: Path) -> Path:
    """tx's tiny Qwen3, written so that transformers 4 (SkyRL's pin) reads it too: in tokenizer_config.json the
    class and the list of extra special tokens under their v4 names, which transformers 5 reads as the same
    tokenizer (same ids, same special tokens); in config.json `rope_theta` also at the top level (the same value
    as in `rope_parameters`). Weights and tokenizer.json are untouched."""
    model_dir = write_tiny_text_model(directory, preset="tiny")
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if isinstance(config.get("extra_special_tokens"), list):
        config["additional_special_tokens"] = config.pop("extra_special_tokens")
    path.write_text(json.dumps(config, indent=2))
    path = model_dir / "config.json"  # rope_theta also at the top, where transformers 4 reads it
    config = json.loads(path.read_text())
    config.setdefault("rope_theta", config["rope_parameters"]["rope_theta"])
    path.write_text(json.dumps(config, indent=2))
    return model_dir


@contextmanager
def adapter(upstream: str, translate: bool, data_dir: Path) -> Iterator[str]:
    """scripts/bench/peer_adapter.py in front of `upstream`: the same loopback hop for both servers."""
    port = free_port()
    log_path = data_dir / "adapter.log"
    cmd = [sys.executable, str(Path(__file__).with_name("peer_adapter.py")), "--upstream", upstream,
           "--port", str(port), *(["--translate"] if translate else [])]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy("adapter", f"{url}/api/v1/healthz", proc, 60, lambda: log_path.read_text(errors="replace"))
        yield url
    finally:
        stop_group(proc, 10)


def batch() -> list[types.Datum]:
    tokens = list(range(10, 10 + SEQ + 1))
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * SEQ})
    return [datum] * BATCH


def backend_batch(size: int = BATCH, length: int = SEQ) -> ForwardBackwardInput:
    """`batch()`'s datums (`size` x `length` tokens) as tx's torch backend takes them: the same calls made
    in one process, no server (lean_body.py, core_siblings.py, server_ab.py --bare)."""
    tokens = list(range(10, 10 + length + 1))
    datum = Datum(ModelInput.from_tokens(tokens[:-1]), {"target_tokens": np.asarray(tokens[1:], np.int64),
                                                        "weights": np.ones(length, np.float32)})
    return ForwardBackwardInput([datum] * size, "cross_entropy", {})


def bare_backend(model_dir: Path, threads: int) -> TorchBackend:
    """tx's torch backend in this process on `model_dir` (base model "m") with the workload's LoRA run
    "run" (rank 8, seed 0), training on `threads` torch threads: a server's calls, without the server."""
    torch.set_num_threads(threads)
    backend = TorchBackend({"m": str(model_dir)}, device="cpu")
    backend.use_threads(threads)
    backend.create_model("run", "m", LoraConfig(rank=RANK, seed=SEED))
    return backend


def sample_once(sampler: tinker.SamplingClient) -> tuple[float, int]:
    prompt = types.ModelInput.from_ints(list(range(20, 36)))
    params = types.SamplingParams(max_tokens=SEQ, temperature=1.0, seed=SEED)
    start = time.perf_counter()
    result = sampler.sample(prompt, BATCH, params).result()
    seconds = time.perf_counter() - start
    assert len(result.sequences) == BATCH
    return seconds, sum(len(s.tokens) for s in result.sequences)


def workload(url: str, model_dir: Path, up: float, cpu: Callable[[], float],
             opts: argparse.Namespace) -> dict[str, float]:
    client = tinker.ServiceClient(base_url=url, api_key=API_KEY)
    tc = client.create_lora_training_client(str(model_dir), rank=RANK, seed=SEED).result()
    setup_s = time.perf_counter() - up
    time.sleep(max(0.0, opts.idle_s - (time.perf_counter() - up)))
    data, steps, waited = batch(), [], []
    adam = types.AdamParams(learning_rate=1e-4)
    for turn in range(opts.warmup + opts.steps):  # each turn: a pipelined step, then a step awaiting each call
        if turn == opts.warmup:
            cpu_start = cpu()
        start = time.perf_counter()
        fb, opt = tc.forward_backward(data, "cross_entropy"), tc.optim_step(adam)
        fb.result()
        opt.result()
        middle = time.perf_counter()
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(adam).result()
        steps.append(middle - start)
        waited.append(time.perf_counter() - middle)
    start = time.perf_counter()
    sampler = tc.save_weights_and_get_sampling_client().result()
    save_s = time.perf_counter() - start
    first_s, first_tokens = sample_once(sampler)
    steady = [sample_once(sampler) for _ in range(opts.samples)]
    steady_s = statistics.median(s for s, _ in steady)
    steady_tokens = statistics.median(n for _, n in steady)
    client.close("success")
    step_cpu_s = (cpu() - cpu_start) / (2 * opts.steps)
    timed = sorted(steps[opts.warmup:])
    return {"setup_s": setup_s, "train_step_s": statistics.median(timed),
            "train_step_p90_s": timed[math.ceil(0.9 * len(timed)) - 1],
            "train_step_awaiting_each_s": statistics.median(waited[opts.warmup:]), "train_step_server_cpu_s": step_cpu_s,
            "first_train_step_s": steps[0], "first_save_and_client_s": save_s, "first_sample_s": first_s,
            "first_sample_tokens_per_s": first_tokens / first_s, "steady_sample_s": steady_s,
            "steady_sample_tokens_per_s": steady_tokens / steady_s, "sampled_tokens": steady_tokens,
            "load_1min": os.getloadavg()[0]}


def run_side(name: str, tmp: Path, model_dir: Path, round_: int, opts: argparse.Namespace) -> dict[str, float]:
    up_dir = tmp / f"{name}-{round_}"
    server = (skyrl_server(opts.skyrl_python, model_dir, up_dir) if name == "skyrl"
              else tx_server(model_dir, up_dir))
    with server as (url, pgid):
        if name == "tx_direct":  # no adapter: what the hop costs tx
            figures = workload(url, model_dir, time.perf_counter(), lambda: group_cpu_s(pgid), opts)
        else:
            with adapter(url, name == "skyrl", up_dir) as proxied:
                figures = workload(proxied, model_dir, time.perf_counter(), lambda: group_cpu_s(pgid), opts)
    print(f"round {round_} {name}: " + json.dumps({k: round(v, 3) for k, v in figures.items()}), file=sys.stderr)
    return figures


def summary(rounds: list[dict[str, float]]) -> dict[str, float | list[float]]:
    out: dict[str, float | list[float]] = {k: round(statistics.median(r[k] for r in rounds), 4) for k in rounds[0]}
    for key in ("train_step_s", "train_step_awaiting_each_s", "first_save_and_client_s",
                "steady_sample_tokens_per_s"):
        out[f"{key}_each"] = [round(r[key], 4) for r in rounds]
    return out


def ratios(tx: dict, skyrl: dict) -> dict[str, float]:
    """Each >= 1 means tx is ahead; the issue's goals: train step >= 10, sampled tokens/s >= 2."""
    return {"train_step_speedup": round(skyrl["train_step_s"] / tx["train_step_s"], 2),
            "train_step_awaiting_each_speedup": round(skyrl["train_step_awaiting_each_s"]
                                                      / tx["train_step_awaiting_each_s"], 2),
            "train_step_server_cpu_ratio": round(skyrl["train_step_server_cpu_s"] / tx["train_step_server_cpu_s"], 2),
            "first_save_and_client_speedup": round(skyrl["first_save_and_client_s"] / tx["first_save_and_client_s"], 2),
            "steady_sample_tokens_per_s": round(tx["steady_sample_tokens_per_s"] / skyrl["steady_sample_tokens_per_s"], 2),
            "first_sample_tokens_per_s": round(tx["first_sample_tokens_per_s"] / skyrl["first_sample_tokens_per_s"], 2)}


def skyrl_version(python: str) -> str:
    code = "import importlib.metadata as m; print(m.version('skyrl-tx'), 'jax', m.version('jax'))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd="/",
                          check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3, help="training steps before the timed ones (JIT, caches)")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per round")
    parser.add_argument("--samples", type=int, default=3, help="steady samples after the first, per round")
    parser.add_argument("--idle-s", type=float, default=5.0, help="from server up to the first training step, at least")
    parser.add_argument("--skyrl-python", default="/work/skyrl-venv/bin/python",
                        help="python of a virtualenv with skyrl-tx[tinker] and CPU jax (see the docstring)")
    parser.add_argument("--tx-direct", action="store_true",
                        help="also tx without the adapter in front (`tx_direct`): what the extra hop costs")
    opts = parser.parse_args()
    sides = ["tx", *(["tx_direct"] if opts.tx_direct else [])]
    report: dict = {"workload": f"{BATCH} x {SEQ} tokens, LoRA rank {RANK}, tiny Qwen3 (hidden 64, 2 layers, "
                                f"vocab 2048), seed {SEED}", "rounds": opts.rounds, "tinker_sdk": tinker.__version__}
    if Path(opts.skyrl_python).is_file():
        sides.append("skyrl")
        report["skyrl"] = skyrl_version(opts.skyrl_python)
    else:
        print(f"SkyRL skipped: no python at {opts.skyrl_python} (see the docstring to set it up)", file=sys.stderr)
        report["skyrl_skipped"] = f"no python at {opts.skyrl_python}"
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    report["load_average_start"] = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="tx-bench-peer-") as tmp:
        model_dir = shared_model(Path(tmp) / "model")
        for r in range(opts.rounds):
            for side in sides:  # alternating, so load drifts hit both alike
                runs[side].append(run_side(side, Path(tmp), model_dir, r, opts))
    for side, rounds in runs.items():
        report[side + "_figures"] = summary(rounds)
    if "skyrl" in runs:
        report["tx_over_skyrl"] = ratios(report["tx_figures"], report["skyrl_figures"])
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
