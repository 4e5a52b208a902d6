"""Trainer memory and speed at real layouts of the new families, Qwen's vocabulary (151,936): MoEs and hybrids.

Three layouts with vocabulary 151,936 (the embedding and head dominate, as in the real models):
- moe: Qwen3-MoE, hidden 256, 2 layers, 16 routed experts of width 256 (top 4), fused into 3-D tensors;
- qwen3_5: Qwen3.5, hidden 256, 4 layers (3 gated-delta-net linear-attention layers, then a full-attention
  one), MLP 768;
- nemotron_h: Nemotron-3 Nano's hidden size (2,688) and layer shapes (Mamba2: 64 heads of 64, state 128, 8
  groups; attention: 32 heads of 128, 2 KV heads; MoE: experts of width 1,856, top 6, a shared expert of
  3,712), one layer of each kind (Mamba2, MoE, attention, Mamba2), with 16 routed experts instead of 128 so
  that it fits this machine (expert LoRA grows with their number). Its rows are padded: the self-check finds
  Mamba2's scan mixing packed datums.

A request of `--datums` datums of random lengths `--min-len` to `--max-len` (default 12 of 32-512, seed 0:
2,909 tokens; cross_entropy), LoRA rank 32. For each
layout it runs tx's forward_backward with the micro-batch's datums packed into rows, and one per padded row
(what the packing self-check chooses decides in production; here both are forced), and for the MoE with and
without expert LoRA (PEFT `target_parameters` on the fused experts, against LoRA on attention and the head
only). It reports the peak RSS of the timed step above the process's RSS after the model, the adapter and one
optimizer step (`torch.cuda.max_memory_allocated` on a GPU), and tokens/s. Every measurement runs in its own
subprocess. Qwen3.5's packed rows are NOT a correct computation in transformers 5.19's torch path (its linear
attention runs across datum boundaries, which is why the self-check refuses them); its figure says what packing
would buy with kernels that honour the boundaries.

Usage: python scripts/bench/train_families.py [--steps 1] [--datums 12] [--min-len 32] [--max-len 512] [--smoke]

`--smoke` (CI's smallest run, tests/test_benches.py): the first case of each layout, at a vocabulary of 2,048.
A case that fails is reported as failed, and the run then exits 1.
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
SMOKE_VOCAB = 2_048
CASES = [  # (layout, packing, expert LoRA)
    ("moe", "packed", True), ("moe", "padded", True), ("moe", "packed", False), ("moe", "padded", False),
    ("qwen3_5", "packed", True), ("qwen3_5", "padded", True),
    ("nemotron_h", "padded", True), ("nemotron_h", "padded", False),
]
NEMOTRON_HIDDEN = 2_688


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _nemotron_h(vocab: int):
    from transformers import NemotronHConfig

    real = vocab != SMOKE_VOCAB  # the smoke run keeps the layout at a small width
    hidden, scale = (NEMOTRON_HIDDEN, 1) if real else (256, 8)
    return NemotronHConfig(
        vocab_size=vocab, hidden_size=hidden, num_attention_heads=32 // scale, num_key_value_heads=2,
        head_dim=128, max_position_embeddings=4096, tie_word_embeddings=False, dtype="float32",
        layers_block_type=["linear_attention", "moe", "full_attention", "linear_attention"], mamba_num_heads=64 // scale,
        mamba_head_dim=64, ssm_state_size=128, n_groups=8 // scale, chunk_size=128, n_routed_experts=16,
        num_experts_per_tok=6, moe_intermediate_size=1_856 // scale, moe_shared_expert_intermediate_size=3_712 // scale,
        intermediate_size=1_856 // scale, architectures=["NemotronHForCausalLM"],
    )


def _config(layout: str, vocab: int):
    from transformers import Qwen3_5TextConfig, Qwen3MoeConfig

    if layout == "nemotron_h":
        return _nemotron_h(vocab)

    common = dict(vocab_size=vocab, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=4096, tie_word_embeddings=False, dtype="float32")
    if layout == "moe":
        config = Qwen3MoeConfig(**common, num_hidden_layers=2, intermediate_size=768, moe_intermediate_size=256,
                                num_experts=16, num_experts_per_tok=4, architectures=["Qwen3MoeForCausalLM"])
        config.head_dim = 64
        return config
    return Qwen3_5TextConfig(**common, num_hidden_layers=4, intermediate_size=768, linear_conv_kernel_dim=4,
                             linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=2,
                             linear_num_value_heads=4, architectures=["Qwen3_5ForCausalLM"],
                             layer_types=["linear_attention"] * 3 + ["full_attention"])


def model_dir(layout: str, vocab: int) -> Path:
    from tx.models.tiny_files import write_model, write_tokenizer

    path = Path(tempfile.gettempdir()) / f"tx-bench-{layout}-v{vocab}"
    if not (path / "model.safetensors").exists():
        ids = write_tokenizer(path)
        write_model(path, _config(layout, vocab), ids, seed=0, name=layout)
    return path


def run(layout: str, packing: str, experts: bool, num_datums: int, lengths_range: tuple[int, int],
        steps: int, vocab: int) -> dict:
    import numpy as np
    import torch

    from tx.backends.torch.backend import TorchBackend
    from tx.optimizers import AdamParams
    from tx.types import Datum, ForwardBackwardInput, LoraConfig, ModelInput

    backend = TorchBackend({"m": model_dir(layout, vocab)}, device="auto")
    backend.create_model("run", "m", LoraConfig(rank=32, seed=0, train_mlp=experts or layout == "qwen3_5"))
    chosen = backend._hosts["m"].packing
    backend._hosts["m"].packing = packing  # forced: the bench compares both layouts of rows
    rng = np.random.default_rng(0)
    lengths = rng.integers(lengths_range[0], lengths_range[1] + 1, size=num_datums)
    rows = [rng.integers(0, 2000, size=n + 1) for n in lengths]
    data = [Datum(ModelInput.from_tokens(r[:-1].tolist()), {"target_tokens": r[1:]}) for r in rows]
    batch = ForwardBackwardInput(data, "cross_entropy")
    backend.forward_backward("run", ForwardBackwardInput(data[:1], "cross_entropy"))
    backend.optim_step("run", AdamParams(learning_rate=1e-4))
    cuda = backend.device.type == "cuda"
    base = torch.cuda.memory_allocated() if cuda else _rss_kib("VmRSS") * 1024
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    start = time.perf_counter()
    for _ in range(steps):
        backend.forward_backward("run", batch)
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if cuda else _rss_kib("VmHWM") * 1024
    lora = sum(p.numel() for _, p in backend.iter_trainable_weights("run"))
    return {"layout": layout, "rows": packing, "expert_lora": experts, "self_check_chose": chosen,
            "tokens": int(lengths.sum()), "lora_parameters": lora, "base_mib": round(base / 2**20),
            "peak_above_base_mib": round((peak - base) / 2**20),
            "tokens_per_s": round(int(lengths.sum()) * steps / elapsed, 1),
            "seconds_per_step": round(elapsed / steps, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--datums", type=int, default=12)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--smoke", action="store_true",
                        help=f"the first case of each layout, vocabulary {SMOKE_VOCAB:,} (CI's smallest run)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, default=VOCAB, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        layout, packing, experts = args.child.split(",")
        lengths = (args.min_len, args.max_len)
        print(json.dumps(run(layout, packing, experts == "1", args.datums, lengths, args.steps, args.vocab)))
        return
    vocab = SMOKE_VOCAB if args.smoke else VOCAB
    first_of_each: dict[str, tuple[str, str, bool]] = {}
    for case in CASES:
        first_of_each.setdefault(case[0], case)
    cases = list(first_of_each.values()) if args.smoke else CASES
    results = []
    for layout, packing, experts in cases:
        model_dir(layout, vocab)
        command = [sys.executable, __file__, "--child", f"{layout},{packing},{int(experts)}",
                   "--steps", str(args.steps), "--datums", str(args.datums), "--min-len", str(args.min_len),
                   "--max-len", str(args.max_len), "--vocab", str(vocab)]
        done = subprocess.run(command, capture_output=True, text=True, env=os.environ, check=False)
        lines = done.stdout.strip().splitlines()
        row = json.loads(lines[-1]) if done.returncode == 0 and lines else {
            "layout": layout, "rows": packing, "expert_lora": experts, "failed": done.stderr.strip()[-300:]}
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"vocab": vocab, "results": results}, indent=1))
    failed = [f"{r['layout']} {r['rows']}" for r in results if "failed" in r]
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
