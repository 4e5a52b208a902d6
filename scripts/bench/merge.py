"""`tx checkpoints export --merge` at Qwen3-8B's shape: the shard-by-shard merge beside PEFT's in-memory one.

Writes a synthetic base in safetensors shards (Qwen3-8B's hidden 4,096, MLP 12,288, 32 heads of 128 with 8 KV
heads, vocabulary 151,936, untied head; random bf16 weights) and a random rank-32 adapter on every attention
and MLP projection and the head, then merges it twice, each in a child process of its own so that its peak RSS
(`resource.getrusage` maxrss) is its own:
- `stream`: `merge_into_base` as tx runs it (`tx/backends/torch/merge.py`: one shard in memory at a time);
- `in_memory`: the whole model loaded and PEFT's `merge_and_unload` (`export.merge_in_memory`, what
  `--merge` did before, and still does for a base whose files it cannot stream), float32 as the trainer loads.

Qwen3-8B has 36 layers (16.4 GB in bf16); the default is 2, as the in-memory merge holds the whole model in
float32 (two layers and the embeddings: 6.5 GB). The layer count is printed with the results. Prints JSON.

    python scripts/bench/merge.py [--layers 2] [--shard-mb 2000] [--rank 32] [--no-in-memory]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

QWEN3_8B = {"hidden": 4096, "intermediate": 12288, "heads": 32, "kv_heads": 8, "head_dim": 128, "vocab": 151_936}
TINY = {"hidden": 64, "intermediate": 128, "heads": 2, "kv_heads": 1, "head_dim": 32, "vocab": 512}
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def shapes(shape: dict[str, int], layers: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Qwen3 base of `shape` by its name in the files."""
    h, i, q, kv = shape["hidden"], shape["intermediate"], shape["heads"] * shape["head_dim"], \
        shape["kv_heads"] * shape["head_dim"]
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape["vocab"], h), "model.norm.weight": (h,),
                                       "lm_head.weight": (shape["vocab"], h)}
    for n in range(layers):
        p = f"model.layers.{n}"
        out |= {f"{p}.self_attn.q_proj.weight": (q, h), f"{p}.self_attn.k_proj.weight": (kv, h),
                f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.o_proj.weight": (h, q),
                f"{p}.self_attn.q_norm.weight": (shape["head_dim"],), f"{p}.self_attn.k_norm.weight": (shape["head_dim"],),
                f"{p}.mlp.gate_proj.weight": (i, h), f"{p}.mlp.up_proj.weight": (i, h), f"{p}.mlp.down_proj.weight": (h, i),
                f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,)}
    return out


def write_base(directory: Path, shape: dict[str, int], layers: int, shard_mb: int) -> int:
    """The synthetic base (config and shards with their index); its size in bytes."""
    from transformers import Qwen3Config

    Qwen3Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
                num_hidden_layers=layers, num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                head_dim=shape["head_dim"], tie_word_embeddings=False, dtype="bfloat16").save_pretrained(directory)
    gen = torch.Generator().manual_seed(0)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = total = 0
    for name, dims in shapes(shape, layers).items():
        tensor = (torch.randn(dims, generator=gen) * 0.02).to(torch.bfloat16)
        if shards[-1] and size + tensor.nbytes > shard_mb * 2**20:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += tensor.nbytes
        total += tensor.nbytes
    weight_map = {}
    for k, tensors in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(directory / file), metadata={"format": "pt"})
        weight_map |= {name: file for name in tensors}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


def write_adapter(directory: Path, shape: dict[str, int], layers: int, rank: int) -> int:
    """A random rank-`rank` PEFT adapter on every projection and the head; its size in bytes."""
    import peft

    peft.LoraConfig(r=rank, lora_alpha=32, target_modules=[*ATTENTION, *MLP, "lm_head"],
                    task_type="CAUSAL_LM").save_pretrained(str(directory))
    gen = torch.Generator().manual_seed(1)
    tensors = {}
    for name, dims in shapes(shape, layers).items():
        module = name.removesuffix(".weight")
        if len(dims) == 2 and module.rsplit(".", 1)[-1] in (*ATTENTION, *MLP, "lm_head"):
            key = f"base_model.model.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn((rank, dims[1]), generator=gen) * 0.01
            tensors[f"{key}.lora_B.weight"] = torch.randn((dims[0], rank), generator=gen) * 0.01
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    return sum(t.nbytes for t in tensors.values())


def child(method: str, adapter: Path, base: Path, out: Path) -> None:
    """One merge in this process; prints its JSON line."""
    from tx.backends.torch import export

    start = time.perf_counter()
    if method == "stream":
        export.merge_into_base(adapter, base, out)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        export.merge_in_memory(adapter, base, out)
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    written = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    print(json.dumps({"seconds": round(seconds, 2), "peak_rss_mib": round(peak_kib / 1024),
                      "written_mib": round(written / 2**20)}))


def run(*args: str) -> dict[str, object]:
    """This script in a child process (`--child ...`): its JSON line. Each step gets its own process, so its peak
    RSS is its own (Linux keeps a process's maxrss across fork and exec: the parent stays small)."""
    result = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"{args[0]} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def write(root: Path, layers: int, shard_mb: int, rank: int, tiny: bool) -> None:
    shape = TINY if tiny else QWEN3_8B
    (root / "base").mkdir(parents=True)
    start = time.perf_counter()
    base_bytes = write_base(root / "base", shape, layers, shard_mb)
    adapter_bytes = write_adapter(root / "adapter", shape, layers, rank)
    print(json.dumps({"base_mib": round(base_bytes / 2**20), "adapter_mib": round(adapter_bytes / 2**20),
                      "shards": len(list((root / "base").glob("*.safetensors"))),
                      "write_s": round(time.perf_counter() - start, 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (Qwen3-8B: 36)")
    parser.add_argument("--shard-mb", type=int, default=2000, help="the base's shard size")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--tiny", action="store_true", help="hidden 64, vocabulary 512: the code path only")
    parser.add_argument("--no-in-memory", action="store_true", help="skip PEFT's whole-model merge")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child and args.child[0] == "write":
        write(Path(args.child[1]), args.layers, args.shard_mb, args.rank, args.tiny)
        return
    if args.child:
        method, adapter, base, out = args.child
        child(method, Path(adapter), Path(base), Path(out))
        return
    shape = TINY if args.tiny else QWEN3_8B
    settings = ["--layers", str(args.layers), "--shard-mb", str(args.shard_mb), "--rank", str(args.rank),
                *(["--tiny"] if args.tiny else [])]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        written = run("write", str(root), *settings)
        report: dict[str, object] = {
            "shape": {**shape, "layers": args.layers, "rank": args.rank, "dtype": "bfloat16"}, **written,
            "stream": run("stream", str(root / "adapter"), str(root / "base"), str(root / "stream")),
        }
        if not args.no_in_memory:
            report["in_memory"] = run("in_memory", str(root / "adapter"), str(root / "base"), str(root / "in_memory"))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
