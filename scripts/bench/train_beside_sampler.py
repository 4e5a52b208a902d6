"""The training step's time while a sampler runs beside it on the same CPUs: the thread budget (tx/cpu.py)
against every process taking every core (tx before the budget), side by side in one run.

Two servers on the same model, both with a local embedded engine (not colocated): "budget" with the default
split, "every_core" with --trainer-threads and --engine-threads set to all the machine's CPUs. For each, in
rounds that alternate between the servers (so load from other jobs hits both alike): `--steps` SDK steps
(forward_backward + optim_step) with the engine idle, then `--steps` steps while one client thread samples
one request after another. Prints JSON: each server's step median and p90 alone and beside the sampler, and the
sampler's tokens/s during the steps.

    python scripts/bench/train_beside_sampler.py [--preset tiny] [--batch 8] [--seq-len 64] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import tinker
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from txserver import TxServer

from tx.cpu import split_threads, usable_cores
from tx.models import write_tiny_text_model

LR = 1e-4


def make_data(batch: int, seq_len: int, vocab: int) -> list[types.Datum]:
    tokens = np.random.default_rng(0).integers(0, vocab - 100, size=(batch, seq_len + 1))
    return [types.Datum(model_input=types.ModelInput.from_ints(row[:-1].tolist()),
                        loss_fn_inputs={"target_tokens": row[1:].tolist(), "weights": [1.0] * seq_len})
            for row in tokens]


class Side:
    """One server, its training client and a sampling client of the same weights."""

    def __init__(self, server: TxServer, model: str, data: list[types.Datum], max_tokens: int) -> None:
        self.client = tinker.ServiceClient(base_url=server.url, api_key="tml-bench")
        self.tc = self.client.create_lora_training_client(model, rank=8, seed=0).result()
        self.sampler = self.tc.save_weights_and_get_sampling_client().result()  # starts the engine
        self.data, self.prompt = data, types.ModelInput.from_ints(list(range(10, 26)))
        self.params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0)
        self.steps: dict[str, list[float]] = {"alone": [], "beside_sampler": []}
        self.sampled_tokens, self.sampling_s = 0, 0.0
        self.step()
        self.sample()

    def step(self) -> float:
        start = time.perf_counter()
        fb = self.tc.forward_backward(self.data, "cross_entropy")
        opt = self.tc.optim_step(types.AdamParams(learning_rate=LR))
        fb.result()
        opt.result()
        return time.perf_counter() - start

    def sample(self) -> int:
        result = self.sampler.sample(self.prompt, num_samples=4, sampling_params=self.params).result()
        return sum(len(s.tokens) for s in result.sequences)

    def round(self, steps: int) -> None:
        self.steps["alone"] += [self.step() for _ in range(steps)]
        stop, tokens = threading.Event(), [0]

        def sample_until_stopped() -> None:
            while not stop.is_set():
                tokens[0] += self.sample()

        thread = threading.Thread(target=sample_until_stopped)
        start = time.perf_counter()
        thread.start()
        time.sleep(0.2)  # the sampler is running when the steps start
        self.steps["beside_sampler"] += [self.step() for _ in range(steps)]
        stop.set()
        thread.join()
        self.sampled_tokens += tokens[0]
        self.sampling_s += time.perf_counter() - start

    def figures(self) -> dict:
        out: dict = {}
        for phase, times in self.steps.items():
            out[f"step_s_median_{phase}"] = round(statistics.median(times), 4)
            out[f"step_s_p90_{phase}"] = round(statistics.quantiles(times, n=10)[8], 4)
        out["slowdown_beside_sampler"] = round(out["step_s_median_beside_sampler"] / out["step_s_median_alone"], 2)
        out["sampled_tokens_per_s"] = round(self.sampled_tokens / self.sampling_s, 1)
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    cores = usable_cores()
    budget = split_threads(None, 1)
    configs = {"budget": [], "every_core": ["--trainer-threads", str(cores), "--engine-threads", str(cores)]}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        model_dir = write_tiny_text_model(Path(tmp) / "model", preset=args.preset)
        data = make_data(args.batch, args.seq_len, 2000)
        sides = {}
        for name, extra in configs.items():
            server = TxServer(Path(tmp) / name, args=["--base-model", str(model_dir), "--no-engine-colocate", *extra])
            stack.callback(server.stop)
            sides[name] = Side(server.start(), str(model_dir), data, args.max_tokens)
            stack.callback(sides[name].client.holder.close)
        for _ in range(args.rounds):
            for side in sides.values():
                side.round(args.steps)
    print(json.dumps({
        "cores": cores, "preset": args.preset, "batch": [args.batch, args.seq_len],
        "steps_per_phase": args.steps * args.rounds, "load_avg_1m": round(os.getloadavg()[0], 2),
        "threads": {"budget": {"trainer": budget.trainer, "engine": budget.engine},
                    "every_core": {"trainer": cores, "engine": cores}},
        **{name: side.figures() for name, side in sides.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
