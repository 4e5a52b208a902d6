"""Benchmark: the embedded engine (HTTP, batched) vs HF `model.generate` on the same model and prompts.

Writes one JSON object to stdout: tokens/s of each, and their ratio (engine / HF; the target is >= 1.0).
The engine runs as its own process with the same thread count as HF; the two take turns (engine, HF, engine,
...), so they never share cores or a GPU at once. Greedy, so the outputs can also be compared token for token.

The model: a tiny preset (`--preset`), a real model's shape with random weights (`--shape qwen3-8b`,
scripts/bench/real_shapes.py) or a local model (`--model DIR`). `--device cuda` runs both there, the base in
--dtype (default: bfloat16 on a GPU, float32 on a CPU, as tx serve does). `--lora-rank R` first pushes a random
LoRA of rank R on every linear layer into the engine, as the trainer pushes one (CUDA IPC on a GPU, gloo on a
CPU), and samples with it; HF generates through a PEFT model with the same tensors. `--push-base` also pushes
the base's own weights (a full-weight sync). Each push is timed as GB/s against a copy of the same bytes on
the device in this process (the same-run ceiling); both are in "weights_in".

    python scripts/bench/engine_generate.py --preset bench --concurrency 8 --max-tokens 64
    python scripts/bench/engine_generate.py --shape qwen3-8b --device cuda --lora-rank 32 --concurrency 64 \
        --max-tokens 256
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from real_shapes import SHAPES, write_random_model
from weight_sync import Memcpy

from tx.inference.engines.embedded import EmbeddedEngineConfig
from tx.inference.engines.kinds import EMBEDDED
from tx.inference.launch.process import spawn, stop, wait_ready
from tx.inference.protocol import ROUTE_GENERATE, SECRET_HEADER
from tx.models.tiny import write_tiny_text_model

ADAPTER = "bench-lora"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_prompts(count: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(min_len, max_len))] for _ in range(count)]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class EngineRunner:
    """The engine in its own process, driven over HTTP with one thread per concurrent request."""

    def __init__(self, model_dir: Path, args, work: Path) -> None:
        self.secret = uuid.uuid4().hex
        self.config = EmbeddedEngineConfig(
            model_dir=model_dir, cluster_secret=self.secret, ready_file=work / "ready.json",
            num_threads=args.threads, max_batch_size=max(32, args.concurrency), log_level="warning",
            device=args.device, dtype=args.dtype,
        )
        self.process = spawn(EMBEDDED, self.config)
        url = wait_ready(self.config, self.process, timeout_s=900)
        self.client = httpx.Client(base_url=url, headers={SECRET_HEADER: self.secret}, timeout=900)
        self.pool = ThreadPoolExecutor(args.concurrency)
        self.adapter: str | None = None

    def post(self, path: str, body: dict) -> dict:
        response = self.client.post(path, json=body)
        response.raise_for_status()
        return response.json()

    def _one(self, prompt: list[int], max_tokens: int) -> list[int]:
        body = dict(prompt_token_ids=prompt, max_tokens=max_tokens, temperature=0.0, stop_at_eos=False,
                    adapter=self.adapter)
        return self.post(ROUTE_GENERATE, body)["sequences"][0]["token_ids"]

    def run(self, prompts, max_tokens: int) -> list[list[int]]:
        return list(self.pool.map(lambda p: self._one(p, max_tokens), prompts))

    def stats(self) -> dict:
        return self.client.get("/health").json()["stats"]

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()
        stop(self.process, EMBEDDED.stop_timeout_s)


class HfRunner:
    """HF `model.generate` on one left-padded batch, in this process (through PEFT with `lora`)."""

    def __init__(self, model_dir: Path, args, lora: tuple[list, dict] | None) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(args.threads)
        self.device = args.device
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=getattr(torch, args.dtype), attn_implementation="sdpa", device_map=args.device
        )
        if lora is not None:
            import peft

            named, spec = lora
            model = peft.get_peft_model(model, peft.LoraConfig(lora_dropout=0.0, **spec))
            state = {name: tensor.to(args.device) for name, tensor in named}
            assert not peft.set_peft_model_state_dict(model, state).unexpected_keys
        self.model = model.eval()
        self.model.generation_config.eos_token_id = None  # always max_tokens, like stop_at_eos=False
        self.pad = self.model.config.pad_token_id or 0

    @torch.no_grad()
    def run(self, prompts, max_tokens: int) -> list[list[int]]:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False, pad_token_id=self.pad
        )
        sync(self.device)
        return out[:, width:].tolist()


# ---- weights in: a LoRA (and the base) pushed as the trainer pushes them


def random_lora(model_dir: Path, rank: int, seed: int = 0) -> tuple[list[tuple[str, torch.Tensor]], dict]:
    """Random float32 LoRA tensors on every linear layer of the model (in PEFT's state-dict names, as the trainer
    pushes them) and their LoRA spec. Shapes come from the model built on the meta device (no weights)."""
    import peft
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = {"r": rank, "lora_alpha": 2.0 * rank, "target_modules": TARGETS}
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_dir)))
    shapes = peft.get_peft_model_state_dict(peft.get_peft_model(meta, peft.LoraConfig(**spec)))
    generator = torch.Generator().manual_seed(seed)
    named = [(name, torch.randn(t.shape, generator=generator) * (0.5 / t.shape[-1] ** 0.5))
             for name, t in shapes.items()]
    return named, spec


def base_weights(model_dir: Path, dtype: str) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    named = []
    for path in sorted(model_dir.glob("*.safetensors")):
        named += [(name, t.to(getattr(torch, dtype))) for name, t in load_file(str(path)).items()]
    return named


class Pusher:
    """Pushes tensors into the engine as tx's trainer does: CUDA IPC handles on a GPU, a gloo broadcast on CPU."""

    def __init__(self, engine: EngineRunner, device: str) -> None:
        from tx.inference.weight_sync import BroadcastSender, TransferInit, free_port

        self.engine, self.device = engine, device
        self.gloo = None
        if not device.startswith("cuda"):
            init = TransferInit(backend="gloo", master_address="127.0.0.1", master_port=free_port(), world_size=2,
                                rank_offset=1, group_name=f"bench-{uuid.uuid4().hex[:8]}", timeout_s=300)
            engine.post("/weights/init", init.model_dump())
            self.gloo = BroadcastSender(init)
            self.gloo.connect()

    def push(self, named, adapter: str | None, spec: dict | None) -> float:
        """Seconds from the first byte packed to the engine's answer (the tensors already on the device)."""
        from tx.inference.weight_sync import IpcSender, plan_update

        sync(self.device)
        start = time.perf_counter()
        if self.gloo is None:
            sender = IpcSender(torch.device(self.device))
            try:
                body = {"ipc": sender.share(named).model_dump(), "adapter": adapter, "lora": spec}
                self.engine.post("/weights/update_ipc", body)
            finally:
                sender.release()
        else:
            update = plan_update(named)
            body = {"transfer": update.model_dump(), "adapter": adapter, "lora": spec}
            with ThreadPoolExecutor(1) as pool:
                answer = pool.submit(self.engine.post, "/weights/update", body)
                self.gloo.send(named, update)
                answer.result(timeout=900)
        return time.perf_counter() - start

    def close(self) -> None:
        if self.gloo is not None:
            self.gloo.close()


def device_copy_s(nbytes: int, device: str, repeats: int = 5) -> float:
    """The best time to copy `nbytes` into a warm buffer on `device` (weight_sync.py's baseline): the same-run
    ceiling of a push."""
    memcpy = Memcpy(nbytes, torch.device(device))
    for _ in range(repeats):
        memcpy.run()
    return min(memcpy.times)


def timed_pushes(pusher: Pusher, named, adapter: str | None, spec: dict | None, repeats: int) -> dict:
    named = [(name, t.to(pusher.device)) for name, t in named]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    seconds = [pusher.push(named, adapter, spec) for _ in range(repeats)]  # the first also loads the adapter
    copy_s = device_copy_s(nbytes, pusher.device)
    steady = statistics.median(seconds[1:]) if repeats > 1 else seconds[0]
    return {"tensors": len(named), "mib": round(nbytes / 2**20, 1), "push_s": [round(s, 4) for s in seconds],
            "gb_per_s": round(nbytes / steady / 1e9, 2), "device_copy_gb_per_s": round(nbytes / copy_s / 1e9, 2),
            "over_device_copy": round(copy_s / steady, 4)}


def timed(run, *args) -> tuple[float, list]:
    start = time.perf_counter()
    result = run(*args)
    return time.perf_counter() - start, result


def interleaved(engine, hf, prompts, max_tokens: int, repeats: int) -> dict:
    """Alternate engine and HF runs, so load from other processes hits both alike."""
    engine.run(prompts[:1], 4), hf.run(prompts[:1], 4)  # warm-up
    times = {"engine": [], "hf": []}
    outputs = {}
    for _ in range(repeats):
        for name, runner in (("engine", engine), ("hf", hf)):
            seconds, outputs[name] = timed(runner.run, prompts, max_tokens)
            times[name].append(seconds)
    return {"seconds": times, "outputs": outputs}


def model_of(args, work: Path) -> Path:
    if args.model:
        return args.model
    if args.shape:
        return write_random_model(args.shape, work / args.shape, args.device, args.layers)
    return write_tiny_text_model(work / "model", preset=args.preset)


def weights_in(engine: EngineRunner, model_dir: Path, args) -> tuple[dict, tuple | None]:
    """Push the LoRA (and with --push-base the base's weights) into the engine, timed; the LoRA for HF."""
    if not (args.lora_rank or args.push_base):
        return {}, None
    pusher = Pusher(engine, args.device)
    figures, lora = {"transport": "cuda_ipc" if pusher.gloo is None else "gloo"}, None
    try:
        if args.push_base:
            figures["base"] = timed_pushes(pusher, base_weights(model_dir, args.dtype), None, None, args.pushes)
        if args.lora_rank:
            lora = random_lora(model_dir, args.lora_rank)
            figures["lora"] = timed_pushes(pusher, lora[0], ADAPTER, lora[1], args.pushes)
            engine.adapter = ADAPTER
    finally:
        pusher.close()
    return figures, lora


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench", help="tx.models.tiny preset (tiny | bench)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="a real shape, random weights")
    parser.add_argument("--layers", type=int, default=None, help="with --shape: fewer layers")
    parser.add_argument("--model", type=Path, default=None, help="a local Hugging Face model")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both the engine and HF)")
    parser.add_argument("--dtype", default=None, help="the base's (default: bfloat16 on cuda, else float32)")
    parser.add_argument("--lora-rank", type=int, default=0, help="push a random LoRA of this rank and use it")
    parser.add_argument("--push-base", action="store_true", help="also time a push of the base's weights")
    parser.add_argument("--pushes", type=int, default=3, help="timed pushes of each (the first loads)")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent requests = HF batch size")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=[16, 48], metavar=("MIN", "MAX"))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")

    with tempfile.TemporaryDirectory(prefix="tx-bench-") as tmp:
        work = Path(tmp)
        model_dir = model_of(args, work)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        prompts = make_prompts(args.concurrency, *args.prompt_len, vocab=min(vocab, 2000), seed=0)
        engine = EngineRunner(model_dir, args, work)
        try:
            before = engine.run(prompts, 8)
            pushed, lora = weights_in(engine, model_dir, args)
            if lora is not None:  # a LoRA that changed nothing would measure nothing
                pushed["lora"]["changed_greedy_outputs"] = sum(a != b for a, b in zip(before, engine.run(prompts, 8)))
            hf = HfRunner(model_dir, args, lora)
            result = interleaved(engine, hf, prompts, args.max_tokens, args.repeats)
            stats = engine.stats()
        finally:
            engine.close()

    num_tokens = args.concurrency * args.max_tokens
    seconds = result["seconds"]
    tps = {name: {"median": num_tokens / statistics.median(s), "best": num_tokens / min(s)}
           for name, s in seconds.items()}
    same = sum(a == b for a, b in zip(result["outputs"]["engine"], result["outputs"]["hf"]))
    print(json.dumps({
        "bench": "engine_generate", "model": args.model.name if args.model else (args.shape or args.preset),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu", "dtype": args.dtype,
        "lora_rank": args.lora_rank, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
        "prompt_len": args.prompt_len, "threads": args.threads, "repeats": args.repeats,
        "engine_tokens_per_s": round(tps["engine"]["median"], 1),
        "hf_generate_tokens_per_s": round(tps["hf"]["median"], 1),
        "ratio": round(tps["engine"]["median"] / tps["hf"]["median"], 3),
        "ratio_best_of_runs": round(tps["engine"]["best"] / tps["hf"]["best"], 3),
        "engine_seconds": [round(x, 3) for x in seconds["engine"]],
        "hf_seconds": [round(x, 3) for x in seconds["hf"]],
        "greedy_outputs_identical": f"{same}/{args.concurrency}",
        "weights_in": pushed,
        "engine_stats": stats,
    }, indent=2))


if __name__ == "__main__":
    main()
