"""Benchmark: the first sampler save and the first sample of a run, through the SDK, side by side in one run.

The workload (SkyRL's SDK workload, the figure of issue 22): a tiny Qwen3 LoRA run (rank 8) takes one training
step on 8 x 64 tokens, then `save_weights_and_get_sampling_client()` (the first: the engine starts here, lazily)
and one `sample` of 8 x 64 tokens; then a second save + sample for reference (the engine running). Each setup
gets a fresh `tx serve`, and the run's first save happens `--idle-s` after the server answered (a script's
import and setup time, during which the standby engine imports):
- `standby`: `tx serve` as shipped (`--engine-standby`: an engine process is started with the server, its imports
  done, no model loaded; the first engine takes it);
- `cold`: `--no-engine-standby` (the engine process starts at the first save and imports then).
Also measured in this process: how long importing the embedded engine takes (`python -m` of it, to the point
where it waits for a config), which the standby takes off the first save.

- `standby_baseline` (with `--baseline-tree DIR`): `standby` served from another checkout (DIR on PYTHONPATH),
  main's for a before/after in one run.

    python scripts/bench/first_sample.py [--rounds 2] [--idle-s 5] [--baseline-tree /work/main] [--no-cold]

(With --baseline-tree, run it from a directory that is no checkout: `python -m` puts the current one first.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tinker
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from txserver import API_KEY, TxServer  # noqa: E402

from tx.models import write_tiny_text_model  # noqa: E402


def one_server(model_dir: Path, data_dir: Path, args: list[str], idle_s: float,
               tree: str | None = None) -> dict[str, float]:
    env = {"PYTHONPATH": tree} if tree else {}  # another checkout's tx serve (and engines), e.g. main's
    server = TxServer(data_dir, args=["--base-model", str(model_dir), "--no-engine-colocate", *args], env=env)
    server.start()
    try:
        started = time.perf_counter()
        client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
        tc = client.create_lora_training_client(str(model_dir), rank=8, seed=0).result()
        tokens = list(range(10, 75))
        datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 64})
        tc.forward_backward([datum] * 8, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        time.sleep(max(0.0, idle_s - (time.perf_counter() - started)))
        prompt = types.ModelInput.from_ints(list(range(20, 36)))
        params = types.SamplingParams(max_tokens=64, temperature=1.0)
        figures: dict[str, float] = {}
        for label in ("first", "second"):
            start = time.perf_counter()
            sampler = tc.save_weights_and_get_sampling_client().result()
            saved = time.perf_counter()
            result = sampler.sample(prompt, 8, params).result()
            done = time.perf_counter()
            assert len(result.sequences) == 8
            figures[f"{label}_save_and_client_s"] = round(saved - start, 3)
            figures[f"{label}_sample_8x64_s"] = round(done - saved, 3)
            figures[f"{label}_total_s"] = round(done - start, 3)
        client.close("success")
        return figures
    finally:
        server.stop()


def engine_import_s() -> float:
    """Seconds from `python -m tx.inference.engines.embedded` (standby) to the point it waits for its config."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "tx.inference.engines.embedded"], stdin=subprocess.PIPE,
                               env={**os.environ, "TX_ENGINE_STANDBY": "1"})
    assert process.stdin is not None
    process.stdin.close()  # it imports, reads EOF, and exits: the import time plus an exit
    process.wait()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=5.0, help="from server up to the first save, at least")
    parser.add_argument("--baseline-tree", help="also `standby` served from this checkout (before/after in one run)")
    parser.add_argument("--no-cold", action="store_true", help="leave out the `cold` setup")
    args = parser.parse_args()
    setups: dict[str, tuple[list[str], str | None]] = {"standby": ([], None)}
    if args.baseline_tree:
        setups["standby_baseline"] = ([], args.baseline_tree)
    if not args.no_cold:
        setups["cold"] = (["--no-engine-standby"], None)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in setups}
    with tempfile.TemporaryDirectory(prefix="tx-bench-first-") as tmp:
        model_dir = write_tiny_text_model(Path(tmp) / "model", preset="tiny")
        for r in range(args.rounds):
            for name, (extra, tree) in setups.items():  # alternating, so load drifts hit both alike
                runs[name].append(one_server(model_dir, Path(tmp) / f"{name}-{r}", extra, args.idle_s, tree))
    report: dict = {"model": "tiny Qwen3 (hidden 64, 2 layers, vocab 2048)", "rounds": args.rounds,
                    "engine_import_s": round(engine_import_s(), 2)}
    for name, results in runs.items():
        report[name] = {key: statistics.median(r[key] for r in results) for key in results[0]}
        report[name]["first_save_and_client_s_each"] = [r["first_save_and_client_s"] for r in results]
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
