"""Two tenants on one server, one submitting 8x the work of the other: each tenant's throughput and latency.

Starts `tx serve --no-engine-colocate` on the tiny model (or `--model`). Tenant "light" (one key) runs one
training run: `steps` steps of forward_backward + optim_step, one after another, each waited for; then samples
one after another. Tenant "heavy" (another key) keeps 8 runs training pipelined streams of the same steps (8x
the light tenant's work, and 8x its runs), then 8 threads sampling without pause. Each phase runs twice: the light
tenant alone, then beside the heavy one; so the light tenant's latency under the burst reads against its own.

Prints one JSON object: per phase and tenant, tokens/s, step (or sample) latency p50/p90, the light tenant's
slowdown (burst / alone), and, from its session's trace, how long its calls waited queued on the server and ran. Fair share by tokens per tenant (tx/core/fairshare.py) keeps that slowdown near 2 for
training (its step waits at most for the heavy step in progress); turns per run would make it about 9.

    python scripts/bench/fair_share.py [--steps 12] [--batch 8] [--seq-len 64] [--samples 12]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import tinker
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from txserver import TxServer

from tx.models import write_tiny_text_model

LIGHT, HEAVY = "tml-bench-light", "tml-bench-heavy"
HEAVY_RUNS = 8
ADAM = types.AdamParams(learning_rate=1e-4)


def make_data(batch: int, seq_len: int, vocab: int, seed: int) -> list[types.Datum]:
    tokens = np.random.default_rng(seed).integers(0, vocab - 100, size=(batch, seq_len + 1))
    return [types.Datum(model_input=types.ModelInput.from_ints(row[:-1].tolist()),
                        loss_fn_inputs={"target_tokens": row[1:].tolist(), "weights": [1.0] * seq_len})
            for row in tokens]


def _tokens(data: list[types.Datum]) -> int:
    return sum(d.model_input.length for d in data)


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 4), "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 4)}


def light_training(tc: tinker.TrainingClient, data: list[types.Datum], steps: int) -> dict:
    latencies = []
    start = time.perf_counter()
    for _ in range(steps):
        began = time.perf_counter()
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(ADAM).result()
        latencies.append(time.perf_counter() - began)
    tokens = steps * _tokens(data)
    return {"tokens_per_s": round(tokens / (time.perf_counter() - start), 1), "step_s": quantiles(latencies)}


def heavy_training(tcs: list[tinker.TrainingClient], data: list[types.Datum], stop: threading.Event) -> dict:
    """Each run keeps 2 steps in flight until `stop`; returns tokens/s over the phase."""
    done = [0] * len(tcs)

    def stream(i: int) -> None:
        pending: list = []
        while not stop.is_set():
            pending.append((tcs[i].forward_backward(data, "cross_entropy"), tcs[i].optim_step(ADAM)))
            if len(pending) > 2:
                for future in pending.pop(0):
                    future.result()
                done[i] += 1
        for pair in pending:
            for future in pair:
                future.result()
            done[i] += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(tcs))]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join()
    tokens = sum(done) * _tokens(data)
    return {"tokens_per_s": round(tokens / (time.perf_counter() - start), 1), "runs": len(tcs)}


def light_sampling(sampler: tinker.SamplingClient, count: int, params: types.SamplingParams) -> dict:
    latencies, tokens = [], 0
    start = time.perf_counter()
    for i in range(count):
        began = time.perf_counter()
        result = sampler.sample(types.ModelInput.from_ints([5 + i, 6, 7]), 4, params).result()
        latencies.append(time.perf_counter() - began)
        tokens += sum(len(s.tokens) for s in result.sequences)
    return {"tokens_per_s": round(tokens / (time.perf_counter() - start), 1), "sample_s": quantiles(latencies)}


def heavy_sampling(sampler: tinker.SamplingClient, params: types.SamplingParams, stop: threading.Event) -> dict:
    tokens = [0] * (2 * HEAVY_RUNS)

    def loop(i: int) -> None:
        while not stop.is_set():
            result = sampler.sample(types.ModelInput.from_ints([9, 10 + i]), 16, params).result()
            tokens[i] += sum(len(s.tokens) for s in result.sequences)

    start = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(tokens))]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join()
    return {"tokens_per_s": round(sum(tokens) / (time.perf_counter() - start), 1), "threads": len(tokens)}


def server_waits(server: TxServer, client: tinker.ServiceClient, key: str, kind: str, since: float) -> dict:
    """From the session's trace (tinker session export-trace): how long the key's `kind` calls submitted after
    `since` (unix time) waited queued on the server, and ran."""
    session = client.holder.get_session_id()
    link = httpx.get(f"{server.url}/api/v1/sessions/{session}/trace_export", headers={"X-API-Key": key}).json()["url"]
    events = httpx.get(link, timeout=60).json()["traceEvents"]
    slices = [e for e in events if e.get("ph") == "X" and e["ts"] / 1e6 >= since]
    queued = [e["dur"] / 1e6 for e in slices if e["name"] == f"{kind} (queued)"]
    ran = [e["dur"] / 1e6 for e in slices if e["name"] == kind]
    return {"queued_s": quantiles(queued), "run_s": quantiles(ran)} if queued and ran else {}


def beside(heavy, light) -> tuple[dict, dict]:
    """Run `light()` while `heavy(stop)` keeps the server busy; (light's figures, heavy's)."""
    stop = threading.Event()
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(heavy=heavy(stop)))
    thread.start()
    time.sleep(2.0)  # the burst is under way
    result = light()
    stop.set()
    thread.join()
    return result, out["heavy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a model directory (default: the tiny preset)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--samples", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tx-fair-") as tmp:
        work = Path(tmp)
        model = args.model or write_tiny_text_model(work / "model", preset="tiny", seed=0)
        params = types.SamplingParams(max_tokens=16, temperature=1.0)
        with TxServer(work / "data", args=["--base-model", str(model), "--no-engine-colocate"]) as server:
            with server.client(LIGHT) as light, server.client(HEAVY) as heavy:
                vocab = 1900
                light_data = make_data(args.batch, args.seq_len, vocab, seed=1)
                heavy_data = make_data(args.batch, args.seq_len, vocab, seed=2)
                tc = light.create_lora_training_client(str(model), rank=8).result()
                heavy_tcs = [heavy.create_lora_training_client(str(model), rank=8).result()
                             for _ in range(HEAVY_RUNS)]
                light_training(tc, light_data, 2)  # warm up
                since = time.time()
                alone = light_training(tc, light_data, args.steps)
                alone["forward_backward_on_server"] = server_waits(server, light, LIGHT, "ForwardBackward",
                                                                   since)
                since = time.time()
                burst, heavy_train = beside(lambda stop: heavy_training(heavy_tcs, heavy_data, stop),
                                            lambda: light_training(tc, light_data, args.steps))
                burst["forward_backward_on_server"] = server_waits(server, light, LIGHT, "ForwardBackward",
                                                                   since)
                light_sampler = tc.save_weights_and_get_sampling_client().result()
                heavy_sampler = heavy_tcs[0].save_weights_and_get_sampling_client().result()
                light_sampling(light_sampler, 2, params)  # warm up (the engine starts)
                since = time.time()
                sample_alone = light_sampling(light_sampler, args.samples, params)
                sample_alone["on_server"] = server_waits(server, light, LIGHT, "Sample", since)
                since = time.time()
                sample_burst, heavy_sample = beside(lambda stop: heavy_sampling(heavy_sampler, params, stop),
                                                    lambda: light_sampling(light_sampler, args.samples, params))
                sample_burst["on_server"] = server_waits(server, light, LIGHT, "Sample", since)
    print(json.dumps({
        "workload": {"batch": args.batch, "seq_len": args.seq_len, "steps": args.steps,
                     "heavy_runs": HEAVY_RUNS, "light_samples": args.samples, "max_tokens": 16},
        "training": {
            "light_alone": alone, "light_beside_heavy": burst, "heavy": heavy_train,
            "light_step_slowdown": round(burst["step_s"]["p50"] / alone["step_s"]["p50"], 2),
        },
        "sampling": {
            "light_alone": sample_alone, "light_beside_heavy": sample_burst, "heavy": heavy_sample,
            "light_sample_slowdown": round(sample_burst["sample_s"]["p50"] / sample_alone["sample_s"]["p50"], 2),
        },
    }, indent=1))


if __name__ == "__main__":
    main()
