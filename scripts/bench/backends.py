"""The torch and jax training backends side by side: the same SDK workload against one server of each.

Both servers serve the same tiny Qwen3 (the `tiny` preset: 2 layers, hidden 64, by default); each step is
forward_backward (cross_entropy) + optim_step of `--batch` x `--seq-len` tokens through the tinker SDK, LoRA
rank 8. Steps alternate between the servers, so both see the same machine noise. Prints JSON: median
seconds per step and tokens/s of each, the first step (jax compiles then), and jax's target (<= 0.1 s).

    python scripts/bench/backends.py [--preset tiny] [--steps 20] [--batch 8] [--seq-len 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import tinker

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import make_batch, tx_steps  # noqa: E402
from txserver import API_KEY, TxServer  # noqa: E402

from tx.models import PRESETS, write_tiny_text_model  # noqa: E402

BACKENDS = ("torch", "jax")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS,
                        help="run only these (one at a time: no other server beside it)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_tiny_text_model(Path(tmp) / "model", preset=args.preset)
        servers = {name: TxServer(Path(tmp) / name, args=["--base-model", str(model_dir), "--backend", name])
                   for name in args.backends}
        clients, times = {}, {name: [] for name in args.backends}
        try:
            for server in servers.values():
                server.start()
            tokens = make_batch(args.batch, args.seq_len, PRESETS[args.preset].vocab_size)
            total = args.warmup + args.steps
            steps = {}
            for name, server in servers.items():
                clients[name] = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
                tc = clients[name].create_lora_training_client(str(model_dir), rank=8, seed=0).result()
                steps[name] = tx_steps(tc, tokens, total)
            for _ in range(total):
                for name in args.backends:
                    times[name].append(next(steps[name]))
        finally:
            for client in clients.values():
                client.close("success")
            for server in servers.values():
                server.stop()

    step_tokens = args.batch * args.seq_len
    report = {"preset": args.preset, "batch": [args.batch, args.seq_len], "lora_rank": 8, "steps": args.steps}
    for name in args.backends:
        median = statistics.median(times[name][args.warmup:])
        report[name] = {"step_s_median": round(median, 4), "tokens_per_s": round(step_tokens / median),
                        "first_step_s": round(times[name][0], 3)}
    if len(args.backends) == 2:
        ratio = report["jax"]["tokens_per_s"] / report["torch"]["tokens_per_s"]
        report["jax_over_torch_tokens_per_s"] = round(ratio, 3)
    report["jax_target_step_s"] = 0.1
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
