"""forward_backward_custom with the loss uploaded (server-side, one round trip) vs run by the SDK (a forward, the
loss on the client, then a surrogate forward_backward), side by side in one run on one tx server.

Prints JSON: median seconds per forward_backward_custom for each path, their ratio, and the largest gap between
the two paths' losses (they must agree to 1e-6).
Usage: python scripts/bench/custom_loss.py [--steps 8] [--batch 8] [--seq-len 128]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tinker
import torch
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from txserver import API_KEY, TxServer  # noqa: E402

BASE = "tiny-qwen3"


def margin_loss(logprobs, weights, advantages):
    margin = torch.nn.functional.logsigmoid(2.0 * logprobs * advantages)
    loss = -(margin * weights).sum()
    return loss, {"custom/margin:sum": -margin.sum()}


def make_data(batch: int, seq_len: int, seed: int) -> list[types.Datum]:
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(batch):
        tokens = rng.integers(10, 1990, size=seq_len + 1).tolist()
        data.append(types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(seq_len, np.float32),
                            "advantages": rng.normal(size=seq_len).astype(np.float32)},
        ))
    return data


def timed(tc: tinker.TrainingClient, handle, data: list[types.Datum]) -> tuple[float, float]:
    start = time.perf_counter()
    out = tc.forward_backward_custom(data, handle).result()
    return time.perf_counter() - start, out.metrics["loss:sum"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = TxServer(Path(tmp) / "data").start()
        try:
            service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
            uploaded = service.create_custom_loss(
                margin_loss, input_ranks={"logprobs": 1, "weights": 1, "advantages": 1}).result()
            local = dataclasses.replace(uploaded, loss_id=None)
            server_tc = service.create_lora_training_client(BASE, rank=8, seed=0).result()
            client_tc = service.create_lora_training_client(BASE, rank=8, seed=0).result()
            times: dict[str, list[float]] = {"server_side": [], "client_side": []}
            gap = 0.0
            for step in range(args.steps + 1):  # step 0 warms up
                data = make_data(args.batch, args.seq_len, step)
                s, loss_s = timed(server_tc, uploaded, data)
                c, loss_c = timed(client_tc, local, data)
                gap = max(gap, abs(loss_s - loss_c) / max(1.0, abs(loss_c)))
                if step:
                    times["server_side"].append(s)
                    times["client_side"].append(c)
            service.close("success")
        finally:
            server.stop()
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({
        "batch": args.batch, "seq_len": args.seq_len, "steps": args.steps,
        "server_side_s": round(medians["server_side"], 4), "client_side_s": round(medians["client_side"], 4),
        "client_over_server": round(medians["client_side"] / medians["server_side"], 3),
        "max_relative_loss_gap": gap,
    }))


if __name__ == "__main__":
    main()
