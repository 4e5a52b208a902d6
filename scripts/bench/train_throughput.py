"""The trainer at a real model's shape: tokens/s, MFU and peak memory of tx's step against plain PEFT's.

One step is a `forward_backward` (cross_entropy over every position) and an `optim_step` (AdamW) on a LoRA of
rank --rank: tx's torch trainer called in-process (`TorchBackend`, its defaults for the device: bfloat16 base and
float32 LoRA on a GPU, its own micro-batches, head and checkpointing), against the same step written with
transformers and PEFT as a user would (the same LoRA targets, HF's own loss from `labels`, gradient
checkpointing and --peft-micro-batch rows per backward, since full logits at real batch sizes do not fit;
--no-peft-checkpointing for small batches). Each
runs in its own subprocess, so peak memory is its own (`torch.cuda.max_memory_allocated`, or peak RSS on CPU).

MFU: model FLOPs over the step's time, against two peaks: the device's bf16 dense figure from its data sheet
(H100/H200: 989 TFLOP/s) and an 8,192^3 bf16 matmul timed in this run (the same-run ceiling). Model FLOPs per
token follow the field's convention, 6 x the matmul parameters (every linear layer and the head; the embedding
lookup is free) + 6 x layers x sequence x attention width for causal attention; with the base frozen the work
done is nearer 4N, so MFU by 6N flatters every LoRA trainer alike. With --profile DIR, one more tx step runs
under the PyTorch profiler: its table of operators by self time goes to DIR and its top ten into the JSON.

    python scripts/bench/train_throughput.py --shape qwen3-8b --batch 8 --seq-len 4096 --device cuda
    python scripts/bench/train_throughput.py --model DIR ...   (a local Hugging Face model instead)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from real_shapes import SHAPES, write_random_model

DATA_SHEET_TFLOPS = {"H100": 989.0, "H200": 989.0, "B200": 2250.0, "A100": 312.0}  # bf16 dense
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def model_flops_per_token(config: dict, seq_len: int) -> float:
    """6N + causal attention (see the module's docstring), from a Qwen3/Llama-style config.json."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_width, kv_width = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    per_layer = hidden * q_width * 2 + hidden * kv_width * 2 + 3 * hidden * config["intermediate_size"]
    matmul_params = layers * per_layer + config["vocab_size"] * hidden
    return 6.0 * matmul_params + 6.0 * layers * seq_len * q_width


def measured_peak_tflops(device: str) -> float:
    """TFLOP/s of a square bf16 matmul (8,192 on a GPU; float32 1,024 on a CPU), best of 10."""
    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (1024, torch.float32)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    best = float("inf")
    for _ in range(10):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_memory_gib(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def make_tokens(batch: int, seq_len: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, vocab - 1000, size=(batch, seq_len + 1))


def tx_steps(model_dir: Path, tokens: np.ndarray, args) -> tuple[list[float], dict]:
    from tx.backends.torch.backend import TorchBackend
    from tx.optimizers import AdamParams
    from tx.types import Datum, ForwardBackwardInput, LoraConfig, ModelInput

    backend = TorchBackend({"model": model_dir}, device=args.device)
    backend.create_model("run", "model", LoraConfig(rank=args.rank, seed=0, train_unembed=args.train_unembed))
    data = [Datum(ModelInput.from_tokens(r[:-1].tolist()), {"target_tokens": r[1:]}) for r in tokens]
    batch = ForwardBackwardInput(data, "cross_entropy")

    def step() -> None:
        backend.forward_backward("run", batch)
        backend.optim_step("run", AdamParams(learning_rate=1e-5))

    times = timed_steps(step, args)
    info = {"dtype": backend.settings.dtype, "gradient_checkpointing": backend.settings.gradient_checkpointing,
            "micro_batch_tokens": backend._budgets.get("model")}
    if args.profile:
        info["profile_top"] = profiled(step, args.device, args.profile / "train_tx.txt")
    return times, info


def peft_steps(model_dir: Path, tokens: np.ndarray, args) -> tuple[list[float], dict]:
    import peft
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa",
                                                 device_map=args.device)
    if args.peft_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    targets = TARGETS + (["lm_head"] if args.train_unembed else [])
    model = peft.get_peft_model(model, peft.LoraConfig(r=args.rank, lora_alpha=32, target_modules=targets))
    model.enable_input_require_grads()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.tensor(tokens, device=args.device)
    rows = args.peft_micro_batch or len(tokens)

    def step() -> None:
        for start in range(0, len(tokens), rows):
            chunk = ids[start:start + rows]
            inputs = chunk[:, :-1]
            model(input_ids=inputs, labels=inputs).loss.backward()  # HF shifts the labels itself
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timed_steps(step, args), {"dtype": str(dtype).removeprefix("torch."),
                                     "gradient_checkpointing": args.peft_checkpointing, "micro_batch_rows": rows}


def timed_steps(step, args) -> list[float]:
    times = []
    for i in range(args.warmup + args.steps):
        if i == args.warmup and args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync(args.device)
        start = time.perf_counter()
        step()
        sync(args.device)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    return times


def profiled(step, device: str, path: Path) -> list[dict]:
    """One step under the profiler; writes its operator table to `path`, returns the top ten by self time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        sync(device)
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    averages = prof.key_averages()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(averages.table(sort_by=key, row_limit=40))
    attribute = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    top = sorted(averages, key=lambda e: getattr(e, attribute, 0), reverse=True)[:10]
    return [{"name": e.key[:80], "self_ms": round(getattr(e, attribute, 0) / 1000, 2), "calls": e.count}
            for e in top]


def child(args) -> None:
    """One implementation's steps in this process; prints its JSON line."""
    config = json.loads((args.model / "config.json").read_text())
    tokens = make_tokens(args.batch, args.seq_len, config["vocab_size"])
    run = tx_steps if args.child == "tx" else peft_steps
    try:
        times, info = run(args.model, tokens, args)
    except torch.OutOfMemoryError as error:
        print(json.dumps({"impl": args.child, "failed": f"out of memory: {str(error)[:200]}"}))
        return
    step_s = statistics.median(times)
    print(json.dumps({"impl": args.child, "step_s": [round(t, 4) for t in times], "step_s_median": step_s,
                      "peak_memory_gib": round(peak_memory_gib(args.device), 2), **info}))


def run_child(impl: str, model_dir: Path, args) -> dict:
    command = [sys.executable, __file__, "--child", impl, "--model", str(model_dir), "--device", args.device,
               "--batch", str(args.batch), "--seq-len", str(args.seq_len), "--rank", str(args.rank),
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--peft-micro-batch", str(args.peft_micro_batch or 0),
               "--train-unembed" if args.train_unembed else "--no-train-unembed",
               "--peft-checkpointing" if args.peft_checkpointing else "--no-peft-checkpointing"]
    if args.profile and impl == "tx":
        command += ["--profile", str(args.profile)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"impl": impl, "failed": f"exit {done.returncode}: {done.stderr[-600:]}"}
    return json.loads(lines[-1])


def summarize(result: dict, tokens: int, flops_per_token: float, peaks: dict) -> dict:
    if "failed" in result:
        return result
    tokens_per_s = tokens / result.pop("step_s_median")
    achieved = tokens_per_s * flops_per_token / 1e12
    result |= {"tokens_per_s": round(tokens_per_s, 1), "model_tflops_per_s": round(achieved, 2)}
    for name, peak in peaks.items():
        if peak:
            result[f"mfu_{name}"] = round(achieved / peak, 4)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the real model")
    parser.add_argument("--model", type=Path, default=None, help="a local model instead of --shape")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--train-unembed", action=argparse.BooleanOptionalAction, default=True,
                        help="a LoRA on the head too (the SDK's default)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--impls", default="tx,peft")
    parser.add_argument("--peft-micro-batch", type=int, default=0, help="rows per PEFT backward (0: all)")
    parser.add_argument("--peft-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                        help="gradient checkpointing in the PEFT step (what a real batch size needs)")
    parser.add_argument("--profile", type=Path, default=None, help="a directory for the profiler's table")
    parser.add_argument("--child", choices=("tx", "peft"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    with tempfile.TemporaryDirectory(prefix="tx-throughput-") as tmp:
        model_dir = args.model
        if model_dir is None:
            start = time.perf_counter()
            model_dir = write_random_model(args.shape, Path(tmp) / args.shape, args.device, args.layers)
            print(f"wrote {args.shape} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        config = json.loads((model_dir / "config.json").read_text())
        flops = model_flops_per_token(config, args.seq_len)
        name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        peaks = {"data_sheet": next((v for k, v in DATA_SHEET_TFLOPS.items() if k in name), None),
                 "measured_matmul": measured_peak_tflops(args.device)}
        results = [summarize(run_child(impl, model_dir, args), args.batch * args.seq_len, flops, peaks)
                   for impl in args.impls.split(",")]
    by_impl = {r["impl"]: r for r in results}
    ratio = None
    if all("tokens_per_s" in by_impl.get(i, {}) for i in ("tx", "peft")):
        ratio = round(by_impl["tx"]["tokens_per_s"] / by_impl["peft"]["tokens_per_s"], 3)
    print(json.dumps({
        "bench": "train_throughput", "model": args.model.name if args.model else args.shape,
        "layers": config["num_hidden_layers"], "device": name, "batch": [args.batch, args.seq_len],
        "lora_rank": args.rank, "train_unembed": args.train_unembed,
        "model_gflop_per_token": round(flops / 1e9, 3),
        "peak_tflops": {k: (round(v, 1) if v else None) for k, v in peaks.items()},
        "results": results, "tokens_per_s_tx_over_peft": ratio,
    }, indent=2))


if __name__ == "__main__":
    main()
