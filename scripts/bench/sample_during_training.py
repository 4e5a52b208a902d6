"""Sampling while a training stream runs: how long one sample waits when the trainer is busy.

Starts `tx serve --base-model <bench model> --no-engine-colocate`, creates a LoRA training client and a
sampling client from its weights, and warms both up. Then, in rounds: an idle phase (samples one after
another, no training), the stream alone (no sampling, for reference), and a busy phase (one thread submits a pipelined stream of forward_backward +
optim_step steps and waits for them; another samples one after another until the stream ends). Idle and
busy phases alternate so load from other jobs hits both alike. Prints one JSON object with medians: sample
latency busy and idle, the stream's wall time with and without sampling, and busy sample latency / stream wall time (target <= 0.2:
sampling is not queued behind the training stream).

    python scripts/bench/sample_during_training.py [--rounds 2] [--steps 15] [--batch 8] [--seq-len 128]
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
from txserver import API_KEY, TxServer  # noqa: E402

from tx.models import write_tiny_text_model  # noqa: E402

LR = 1e-4


def make_data(batch: int, seq_len: int, vocab: int) -> list[types.Datum]:
    tokens = np.random.default_rng(0).integers(0, vocab - 100, size=(batch, seq_len + 1))
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(row[:-1].tolist()),
            loss_fn_inputs={"target_tokens": row[1:].tolist(), "weights": [1.0] * seq_len},
        )
        for row in tokens
    ]


def train_stream(tc: tinker.TrainingClient, data: list[types.Datum], steps: int) -> float:
    """Submit every step at once (pipelined), wait for all; the stream's wall time."""
    start = time.perf_counter()
    futures = []
    for _ in range(steps):
        futures.append(tc.forward_backward(data, "cross_entropy"))
        futures.append(tc.optim_step(types.AdamParams(learning_rate=LR)))
    for future in futures:
        future.result()
    return time.perf_counter() - start


class Sampler:
    def __init__(self, client: tinker.SamplingClient, prompt: list[int], max_tokens: int) -> None:
        self.client, self.prompt = client, types.ModelInput.from_ints(prompt)
        self.params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0)
        self.max_tokens = max_tokens

    def one(self) -> float:
        start = time.perf_counter()
        result = self.client.sample(self.prompt, num_samples=1, sampling_params=self.params).result()
        seconds = time.perf_counter() - start
        assert len(result.sequences) == 1 and len(result.sequences[0].tokens) <= self.max_tokens
        return seconds

    def until(self, stop: threading.Event, out: list[float]) -> None:
        while not stop.is_set():
            seconds = self.one()
            if not stop.is_set():  # only samples that ran entirely during the stream
                out.append(seconds)


def busy_phase(tc, data, steps: int, sampler: Sampler) -> dict:
    stop = threading.Event()
    latencies: list[float] = []
    thread = threading.Thread(target=sampler.until, args=(stop, latencies))
    thread.start()
    try:
        wall = train_stream(tc, data, steps)
    finally:
        stop.set()
        thread.join()
    return {"stream_wall_s": wall, "latencies": latencies}


def engine_info(server: TxServer) -> list[dict]:
    r = httpx.get(f"{server.url}/api/v1/tx/engines", headers={"X-API-Key": API_KEY}, timeout=30)
    r.raise_for_status()
    return [{"name": e["name"], "pid": e["pid"], "alive": e["alive"], "state": g["state"]}
            for g in r.json()["groups"] for e in g["engines"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="idle + busy phases")
    parser.add_argument("--steps", type=int, default=15, help="forward_backward + optim_step per stream")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per sample")
    parser.add_argument("--idle-samples", type=int, default=12, help="samples per idle phase")
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tx-bench-sdt-") as tmp:
        model_dir = write_tiny_text_model(Path(tmp) / "bench-model", preset="bench")
        server = TxServer(Path(tmp) / "data", args=["--base-model", str(model_dir), "--no-engine-colocate"])
        server.start()
        try:
            client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
            tc = client.create_lora_training_client(str(model_dir), rank=args.rank, seed=0).result()
            data = make_data(args.batch, args.seq_len, 8000)
            train_stream(tc, data, 2)  # warm-up: the trainer
            sampling = tc.save_weights_and_get_sampling_client().result()
            prompt = np.random.default_rng(1).integers(10, 7000, size=16).tolist()
            sampler = Sampler(sampling, prompt, args.max_tokens)
            for _ in range(3):  # warm-up: the engine starts lazily and loads the adapter
                sampler.one()
            engines = engine_info(server)

            idle: list[float] = []
            alone: list[float] = []
            busy: list[dict] = []
            for _ in range(args.rounds):
                idle.extend(sampler.one() for _ in range(args.idle_samples))
                alone.append(train_stream(tc, data, args.steps))
                busy.append(busy_phase(tc, data, args.steps, sampler))
            idle.extend(sampler.one() for _ in range(args.idle_samples))  # idle on both sides of each busy
            client.close("success")
        finally:
            server.stop()

    busy_latencies = [s for phase in busy for s in phase["latencies"]]
    walls = [phase["stream_wall_s"] for phase in busy]
    wall_med, idle_med = statistics.median(walls), statistics.median(idle)
    # None when no sample ran entirely during a stream (streams shorter than a sample)
    busy_med = statistics.median(busy_latencies) if busy_latencies else None
    print(json.dumps({
        "model": "bench preset (~21M parameters)",
        "lora_rank": args.rank,
        "stream": {"steps": args.steps, "batch": [args.batch, args.seq_len], "pipelined": True},
        "sample_max_tokens": args.max_tokens,
        "engines": engines,
        "busy_sample_latency_s_median": round(busy_med, 4) if busy_med is not None else None,
        "busy_sample_latency_s_max": round(max(busy_latencies), 4) if busy_latencies else None,
        "busy_samples_total": len(busy_latencies),
        "busy_samples_per_stream": [len(phase["latencies"]) for phase in busy],
        "stream_wall_s_median": round(wall_med, 3),
        "stream_wall_s": [round(w, 3) for w in walls],
        "ratio_sample_latency_over_stream_wall":
            round(busy_med / wall_med, 4) if busy_med is not None else None,
        "target_ratio": 0.2,
        "stream_alone_wall_s_median": round(statistics.median(alone), 3),
        "stream_alone_wall_s": [round(w, 3) for w in alone],
        "stream_slowdown_from_sampling": round(wall_med / statistics.median(alone), 2),
        "idle_sample_latency_s_median": round(idle_med, 4),
        "idle_samples_total": len(idle),
        "busy_over_idle_sample_latency": round(busy_med / idle_med, 2) if busy_med is not None else None,
    }, indent=2))


if __name__ == "__main__":
    main()
