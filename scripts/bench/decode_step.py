"""Benchmark: the embedded engine's decode step on SkyRL's SDK workload, driven directly (no HTTP, no scheduler
thread): a tiny Qwen3 (`--preset`; `vocab-h256` has Qwen3's 151,936 ids, where the head is most of a step), one
LoRA adapter of rank 8 on every attention and MLP linear layer, one request of 8 samples x 64 new tokens
(temperature 1, seeded, EOS not stopping). At real sizes: `--model DIR` (a Qwen3 at a real shape,
scripts/bench/real_shapes.py), `--prompt-len N` (a long prompt: a wide KV cache) and `--max-tokens`.

Each measurement runs in a child process (`--worker`) with the tree under test first on PYTHONPATH, so this tree
and a baseline checkout (`--baseline-tree /work/main`) run side by side in one run, alternating round by round.
Prints one JSON object: per tree and round tokens/s (prefill + decode), ms per decode step and the worker's peak
RSS, the medians, whether both trees sampled the same tokens and how far their logprobs are apart, the load
average, and (`--profile`) a cProfile of the decode steps per tree, grouped by where the time goes.

    python scripts/bench/decode_step.py --rounds 5 --baseline-tree /work/main --profile
    python scripts/bench/decode_step.py --model /tmp/qwen3-0.6b --prompt-len 1024 --baseline-tree DIR
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RANK, SAMPLES, MAX_TOKENS = 8, 8, 64
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = list(range(20, 36))

# cProfile rows (function names, "file:function") grouped into the costs a decode step is made of
GROUPS = {
    "lora (peft, lean_lora.py)": ("peft/tuners/lora", "lean_lora.py"),
    "lean decode step (lean_decode.py)": ("lean_decode.py",),
    "sampling + logprobs": ("generate.py:sample_next", "generate.py:_sample_rows", "sorting.py", "torch.sort"),
    "kv cache (update, reorder, merge)": ("cache_utils.py",),
    "attention (sdpa + masks)": ("masking_utils.py", "sdpa_attention.py", "scaled_dot_product_attention"),
    "linear (matmul)": ("<built-in method torch._C._nn.linear>",),
}


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    from tx.inference.engines.embedded.batch import Job, RunningBatch
    from tx.inference.engines.embedded.weights import Weights
    from tx.inference.protocol import EngineStats, GenerateRequest, LoraSpec

    weights = Weights(args.model_dir, max_adapters=4)
    tensors = torch.load(args.adapter_file)
    weights.load_adapter("a", LoraSpec(r=RANK, lora_alpha=32, target_modules=TARGETS), tensors)
    prompt = PROMPT if args.prompt_len is None else [20 + i % 2000 for i in range(args.prompt_len)]
    request = GenerateRequest(prompt_token_ids=prompt, n=SAMPLES, max_tokens=args.max_tokens, temperature=1.0,
                              seed=1234, stop_at_eos=False, adapter="a")

    def one(profile: Any = None) -> tuple[float, list[float], list[Any]]:
        batch, job = RunningBatch(weights, EngineStats()), Job(request)
        steps: list[float] = []
        start = time.perf_counter()
        with torch.inference_mode():
            batch.admit([job])
            if profile is not None:
                profile.enable()
            while batch.rows:
                t = time.perf_counter()
                batch.step()
                steps.append(time.perf_counter() - t)
            if profile is not None:
                profile.disable()
        return time.perf_counter() - start, steps, job.future.result().sequences

    one()  # warm-up
    if args.profile:
        import cProfile

        profile = cProfile.Profile()
        for _ in range(args.repeats):
            one(profile)
        return {"profile": _grouped(profile, args.repeats * (args.max_tokens - 1))}
    walls, steps = [], []
    sequences: list[Any] = []
    for _ in range(args.repeats):
        wall, step, sequences = one()
        walls.append(wall)
        steps += step
    tokens = SAMPLES * args.max_tokens
    return {
        "tokens_per_s": round(tokens / statistics.median(walls), 1),
        "ms_per_decode_step": round(1000 * statistics.median(steps), 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # KiB on Linux
        "token_ids": [s.token_ids for s in sequences],
        "logprobs": [s.logprobs for s in sequences],
    }


def _grouped(profile: Any, steps: int) -> dict[str, Any]:
    """The profile's time per decode step: total, per group (tottime of matching functions), and the top
    functions by own time."""
    import pstats

    stats = pstats.Stats(profile)
    rows = []
    for (path, line, name), (_cc, calls, tottime, _cum, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((f"{path.rsplit('site-packages/', 1)[-1]}:{name}" if line else name, calls, tottime))
    total = sum(r[2] for r in rows)
    groups = {group: 0.0 for group in GROUPS}
    for label, _calls, tottime in rows:
        for group, needles in GROUPS.items():
            if any(n in label for n in needles):
                groups[group] += tottime
                break
    groups["other python (modules, hooks, glue)"] = total - sum(groups.values())
    ms = lambda s: round(1000 * s / steps, 3)  # noqa: E731
    top = sorted(rows, key=lambda r: -r[2])[:15]
    return {
        "ms_per_step_profiled": ms(total),
        "ms_per_step_by_group": {g: ms(s) for g, s in groups.items()},
        "calls_per_step": round(sum(r[1] for r in rows) / steps),
        "top_own_time_ms_per_step": {label: ms(t) for label, _c, t in top},
    }


def run_worker(tree: Path, args: argparse.Namespace, profile: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(args.threads)}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--model-dir", str(args.model_dir),
               "--adapter-file", str(args.adapter_file), "--threads", str(args.threads),
               "--repeats", str(args.repeats), "--max-tokens", str(args.max_tokens)] \
        + (["--prompt-len", str(args.prompt_len)] if args.prompt_len else []) + (["--profile"] if profile else [])
    out = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"worker for {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def prepare(work: Path, preset: str, model_dir: Path | None) -> tuple[Path, Path]:
    import torch
    from transformers import AutoModelForCausalLM

    from tx.models.tiny import write_tiny_text_model

    model_dir = model_dir or write_tiny_text_model(work / "model", preset=preset)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    generator, tensors = torch.Generator().manual_seed(0), {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in TARGETS and isinstance(module, torch.nn.Linear):
            tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(RANK, module.in_features,
                                                                           generator=generator) * 0.05
            tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(module.out_features, RANK,
                                                                           generator=generator) * 0.05
    torch.save(tensors, work / "adapter.pt")
    return model_dir, work / "adapter.pt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="8 x 64 samples per round and tree (after a warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (tx/cpu.py's engine share on 2 cores)")
    parser.add_argument("--baseline-tree", type=Path, help="another checkout to run alternating with this one")
    parser.add_argument("--profile", action="store_true", help="also a cProfile of the decode steps per tree")
    parser.add_argument("--preset", default="tiny", help="the tiny Qwen3's preset (vocab-h256: Qwen3's 151,936 ids)")
    parser.add_argument("--model", type=Path, help="a local Qwen3 model instead of a preset (real_shapes.py)")
    parser.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default: SkyRL's 16)")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--adapter-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    this = Path(__file__).resolve().parents[2]
    trees = {"this": this} | ({"baseline": args.baseline_tree.resolve()} if args.baseline_tree else {})
    with tempfile.TemporaryDirectory() as tmp:
        args.model_dir, args.adapter_file = prepare(Path(tmp), args.preset, args.model)
        load_before = Path("/proc/loadavg").read_text().split()[:3]
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 else list(reversed(trees))
            for name in order:
                rounds[name].append(run_worker(trees[name], args, profile=False))
        profiles = {name: run_worker(tree, args, profile=True)["profile"] for name, tree in trees.items()} \
            if args.profile else {}
        load_after = Path("/proc/loadavg").read_text().split()[:3]
    model = args.model.name if args.model else f"tiny Qwen3 ({args.preset})"
    prompt = f"{args.prompt_len}-token prompt" if args.prompt_len else f"{len(PROMPT)}-token prompt"
    report: dict[str, Any] = {"workload": f"{SAMPLES} x {args.max_tokens} tokens, {prompt}, {model}, "
                                          f"LoRA rank {RANK}",
                              "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats,
                              "loadavg_before": load_before, "loadavg_after": load_after}
    for name, results in rounds.items():
        report[name] = {
            "tree": str(trees[name]),
            "tokens_per_s_median": statistics.median(x["tokens_per_s"] for x in results),
            "ms_per_decode_step_median": statistics.median(x["ms_per_decode_step"] for x in results),
            "tokens_per_s_rounds": [x["tokens_per_s"] for x in results],
            "ms_per_decode_step_rounds": [x["ms_per_decode_step"] for x in results],
            "peak_rss_mib_rounds": [x["peak_rss_mib"] for x in results],
        }
        if name in profiles:
            report[name]["profile"] = profiles[name]
    if "baseline" in rounds:
        a, b = rounds["this"][0], rounds["baseline"][0]
        report["same_tokens"] = a["token_ids"] == b["token_ids"]
        report["max_logprob_diff"] = max(abs(x - y) for p, q in zip(a["logprobs"], b["logprobs"])
                                         for x, y in zip(p, q))
        report["speedup"] = round(report["this"]["tokens_per_s_median"] /
                                  report["baseline"]["tokens_per_s_median"], 3)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
