"""The sampling stall an inflight update causes: how much longer a long sample takes when the weights it samples
are updated in place while it generates.

Starts `tx serve --base-model <bench model>`, a LoRA training client and an inflight sampling client. In rounds,
side by side, one long greedy sample (--max-tokens, no stop) on the inflight client:
- `idle`: nothing else happens;
- `inflight`: meanwhile, inflight saves back to back (`save_weights_and_get_sampling_client(kind="inflight")`):
  each pushes the run's weights into the sample's own adapter, in place, between two of its decode steps;
- `snapshot`: meanwhile, as many snapshot saves: the same save and push work, into another adapter, so the
  sample's weights never change (what saving and pushing cost the engine's CPU, without the swap).
Stall per update = (phase's sample time - idle sample time) / updates that landed during the sample. Also the
publisher's push time per update (/metrics `tx_weight_push_seconds`), and, in this process, how long the embedded
engine's weights lock is held by one in-place update (`Weights.load_adapter` on an adapter it holds; CPU time):
the time during which no decode step can run, the stall's floor. Medians over rounds; prints JSON, and the load
average (the wall times are only as good as the box is quiet).

    python scripts/bench/inflight_stall.py [--rounds 3] [--max-tokens 256] [--updates 4] [--rank 32]
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from txserver import API_KEY, TxServer  # noqa: E402

from tx.models import write_tiny_text_model  # noqa: E402


def push_seconds(server: TxServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    match = re.search(r"^tx_weight_push_seconds(?:_total)?\s+([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def lock_hold_s(model_dir: Path, rank: int, repeats: int = 20) -> list[float]:
    """CPU seconds the embedded engine's weights lock is held by each of `repeats` in-place updates of a
    rank-`rank` adapter on every linear layer of the attention and the MLP (where the trainer puts them), each from
    freshly received tensors. CPU time, not wall time: on a loaded box wall time is mostly waiting for a core."""
    import torch
    from continuous_batching import lora_layout

    from tx.inference.engines.embedded.weights import Weights

    shapes, spec = lora_layout(model_dir, rank)
    weights = Weights(model_dir, max_adapters=2)
    tensors = {name: torch.randn(shape) * 0.01 for name, shape in shapes.items()}
    weights.load_adapter("inflight1", spec, tensors)  # created once; every later update is in place
    held = []
    for _ in range(repeats):
        received = {name: torch.randn(shape) * 0.01 for name, shape in shapes.items()}
        start = time.thread_time()
        weights.load_adapter("inflight1", spec, received)
        held.append(time.thread_time() - start)
    weights.close()
    return held


def one_phase(tc: tinker.TrainingClient, sampler: tinker.SamplingClient, prompt: types.ModelInput,
              params: types.SamplingParams, updates: int, kind: str | None, server: TxServer) -> dict:
    """One long sample; with `kind`, `updates` saves of that kind while it runs. Its time, the saves that
    finished while it ran, and their push seconds."""
    done = threading.Event()
    landed: list[float] = []
    pushed_before = push_seconds(server)

    def save() -> None:
        for _ in range(updates):
            if done.is_set():
                return
            tc.save_weights_and_get_sampling_client(kind=kind).result()
            if not done.is_set():
                landed.append(time.perf_counter())

    start = time.perf_counter()
    future = sampler.sample(prompt, 1, params)
    thread = threading.Thread(target=save) if kind is not None else None
    if thread is not None:
        time.sleep(0.2)  # the sample is generating
        thread.start()
    (seq,) = future.result().sequences
    seconds = time.perf_counter() - start
    done.set()
    if thread is not None:
        thread.join()
    assert len(seq.tokens) == params.max_tokens and seq.stop_reason == "length", seq.stop_reason
    return {"seconds": seconds, "updates": len(landed), "push_s": push_seconds(server) - pushed_before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--updates", type=int, default=4, help="saves per phase (those landing mid-sample count)")
    parser.add_argument("--rank", type=int, default=32)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tx-bench-inflight-") as tmp:
        model_dir = write_tiny_text_model(Path(tmp) / "bench-model", preset="bench")
        server = TxServer(Path(tmp) / "data", args=["--base-model", str(model_dir), "--no-engine-colocate"])
        server.start()
        try:
            client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
            tc = client.create_lora_training_client(str(model_dir), rank=args.rank, seed=0).result()
            sampler = tc.save_weights_and_get_sampling_client(kind="inflight").result()
            prompt = types.ModelInput.from_ints(np.random.default_rng(1).integers(10, 7000, size=16).tolist())
            params = types.SamplingParams(max_tokens=args.max_tokens, temperature=0.0, stop=[])
            sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8)).result()  # warm-up: engine, adapter
            tc.save_weights_and_get_sampling_client().result()  # warm-up: a snapshot save and its push
            phases: dict[str, list[dict]] = {"idle": [], "inflight": [], "snapshot": []}
            for _ in range(args.rounds):
                for name, kind in (("idle", None), ("inflight", "inflight"), ("snapshot", "snapshot")):
                    phases[name].append(one_phase(tc, sampler, prompt, params, args.updates, kind, server))
            client.close("success")
        finally:
            server.stop()
        held = lock_hold_s(model_dir, args.rank)

    idle = statistics.median(p["seconds"] for p in phases["idle"])
    report: dict = {
        "model": "bench preset (~21M parameters)", "lora_rank": args.rank, "sample_tokens": args.max_tokens,
        "idle_sample_s_median": round(idle, 3), "idle_sample_s": [round(p["seconds"], 3) for p in phases["idle"]],
        "engine_lock_held_cpu_s_per_update_median": round(statistics.median(held), 5),
        "decode_step_s_idle": round(idle / args.max_tokens, 5),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    for name in ("inflight", "snapshot"):
        runs = phases[name]
        stalls = [(p["seconds"] - idle) / p["updates"] for p in runs if p["updates"]]
        pushes = [p["push_s"] / p["updates"] for p in runs if p["updates"]]
        report[name] = {
            "sample_s": [round(p["seconds"], 3) for p in runs],
            "updates_during_sample": [p["updates"] for p in runs],
            "stall_per_update_s_median": round(statistics.median(stalls), 4) if stalls else None,
            "push_s_per_update_median": round(statistics.median(pushes), 4) if pushes else None,
        }
    inflight, snapshot = report["inflight"], report["snapshot"]
    if inflight["stall_per_update_s_median"] is not None and snapshot["stall_per_update_s_median"] is not None:
        report["swap_stall_per_update_s"] = round(
            inflight["stall_per_update_s_median"] - snapshot["stall_per_update_s_median"], 4)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
