"""Trainer memory and speed at Qwen3's vocabulary: tx's forward_backward against the naive padded one-pass step.

Two-layer models with vocabulary 151,936 and hidden 64 or 256 (`tx models make-tiny --preset vocab-h64` /
`vocab-h256`), LoRA rank 32 on every module (the default run), cross_entropy over every position. For each
(model, batch x length) it reports, per implementation:
- peak_above_base_mib: the training process's peak RSS during the timed forward_backward, above its RSS after
  the model, the adapter and one optimizer step (AdamW's state) were made; `torch.cuda.max_memory_allocated`
  on a GPU;
- tokens_per_s of forward_backward.
Every measurement runs in its own subprocess so peaks do not mix. The naive step (full float32 logits,
log_softmax, gather, one backward) is skipped at 32 x 2,048 tokens: its logits alone are 65,536 x 151,936 x 4
bytes = 40 GB.

A measurement that fails is reported as failed, and the run then exits 1.

Usage: python scripts/bench/train_memory.py [--sizes 4x1024,32x2048] [--hiddens 64,256] [--steps 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB = 151_936
NAIVE_LIMIT_TOKENS = 16_384  # beyond this the naive logits (tokens x vocab x 4 bytes x ~3) cannot fit here


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / (1 << 20)
    return 0.0


def _tokens(batch: int, length: int):
    import numpy as np

    return np.random.default_rng(0).integers(0, VOCAB - 1, size=(batch, length + 1))


def _measure(step, warmup, tokens: int, steps: int, cuda: bool) -> dict:
    import torch

    warmup()
    base = torch.cuda.memory_allocated() if cuda else _rss_kib("VmRSS") * 1024
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        _reset_peak()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if cuda else _rss_kib("VmHWM") * 1024
    return {
        "base_mib": round(base / 2**20),
        "peak_above_base_mib": round((peak - base) / 2**20),
        "tokens_per_s": round(tokens * steps / elapsed, 1),
        "seconds_per_step": round(elapsed / steps, 2),
    }


def run_tx(model_dir: Path, batch: int, length: int, steps: int) -> dict:
    import torch

    from tx.backends.torch.backend import TorchBackend
    from tx.optimizers import AdamParams
    from tx.types import Datum, ForwardBackwardInput, LoraConfig, ModelInput

    backend = TorchBackend({"m": model_dir}, device="auto")
    backend.create_model("run", "m", LoraConfig(rank=32, seed=0))
    rows = _tokens(batch, length)

    def data(rows_):
        return [Datum(ModelInput.from_tokens(r[:-1].tolist()), {"target_tokens": r[1:]}) for r in rows_]

    full, small = data(rows), data(rows[:1, :129])

    def warmup():
        backend.forward_backward("run", ForwardBackwardInput(small, "cross_entropy"))
        backend.optim_step("run", AdamParams(learning_rate=1e-4))

    result = _measure(lambda: backend.forward_backward("run", ForwardBackwardInput(full, "cross_entropy")),
                      warmup, batch * length, steps, backend.device.type == "cuda")
    result["micro_batch_tokens"] = backend._budgets["m"]
    result["dtype"] = str(backend.settings.dtype)
    del torch
    return result


def run_naive(model_dir: Path, batch: int, length: int, steps: int) -> dict:
    """The same model, LoRA and loss in plain torch + PEFT: one padded pass, full float32 logits."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    from tx.backends.torch.lora import peft_config_for
    from tx.models.lora_targets import read_structure
    from tx.types import LoraConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    model = model.to(device)
    config = peft_config_for(LoraConfig(rank=32, seed=0), read_structure(model))
    model = peft.get_peft_model(model.eval(), config)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    rows = torch.tensor(_tokens(batch, length), device=device)

    def step(rows_=rows):
        logits = model(input_ids=rows_[:, :-1]).logits.float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, rows_[:, 1:, None])
        (-logp.sum()).backward()

    def warmup():
        step(rows[:1, :129])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _measure(step, warmup, batch * length, steps, device == "cuda")


def model_dir(hidden: int) -> Path:
    from tx.models import write_tiny_text_model

    path = Path(tempfile.gettempdir()) / f"tx-bench-vocab-h{hidden}"
    if not (path / "model.safetensors").exists():
        write_tiny_text_model(path, preset=f"vocab-h{hidden}")
    return path


def child(args: argparse.Namespace) -> None:
    batch, length = (int(x) for x in args.size.split("x"))
    runner = run_tx if args.impl == "tx" else run_naive
    print(json.dumps(runner(model_dir(args.hidden), batch, length, args.steps)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4x1024,32x2048")
    parser.add_argument("--hiddens", default="64,256")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--impls", default="tx,naive")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    results = []
    for hidden in (int(h) for h in args.hiddens.split(",")):
        model_dir(hidden)
        for size in args.sizes.split(","):
            batch, length = (int(x) for x in size.split("x"))
            row = {"hidden": hidden, "vocab": VOCAB, "batch": batch, "seq_len": length}
            for impl in args.impls.split(","):
                if impl == "naive" and batch * length > NAIVE_LIMIT_TOKENS:
                    gb = batch * length * VOCAB * 4 / 1e9
                    row[impl] = {"skipped": f"its float32 logits alone are {gb:.0f} GB"}
                    continue
                row[impl] = _child(impl, hidden, size, args.steps)
            speeds = [row.get(impl, {}).get("tokens_per_s") for impl in ("tx", "naive")]
            if None not in speeds:
                row["tx_over_naive_tokens_per_s"] = round(speeds[0] / speeds[1], 3)
            results.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"available_gib_at_end": round(_available_gib(), 1), "results": results}, indent=1))
    failed = [f"{impl} h{r['hidden']} {r['batch']}x{r['seq_len']}" for r in results
              for impl in ("tx", "naive") if "failed" in r.get(impl, {})]
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


def _child(impl: str, hidden: int, size: str, steps: int) -> dict:
    command = [sys.executable, __file__, "--child", "--impl", impl, "--hidden", str(hidden), "--size", size,
               "--steps", str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ)
    if done.returncode != 0:
        return {"failed": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
