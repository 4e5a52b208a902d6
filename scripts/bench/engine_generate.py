"""Benchmark: the embedded engine (HTTP, batched) vs HF `model.generate` on the same model and prompts.

Writes one JSON object to stdout: tokens/s of each, and their ratio (engine / HF; the target is >= 1.0).
The engine runs as its own process with the same thread count as HF, and is stopped before HF runs, so the
two never share cores. Greedy by default, so the outputs can also be compared token for token.

    python scripts/bench/engine_generate.py --preset bench --concurrency 8 --max-tokens 64
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

from tx.inference.engines.embedded import EmbeddedEngineConfig
from tx.inference.engines.kinds import EMBEDDED
from tx.inference.launch.process import spawn, stop, wait_ready
from tx.inference.protocol import ROUTE_GENERATE, SECRET_HEADER
from tx.models.tiny import write_tiny_text_model


def make_prompts(count: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(min_len, max_len))] for _ in range(count)]


class EngineRunner:
    """The engine in its own process, driven over HTTP with one thread per concurrent request."""

    def __init__(self, model_dir: Path, threads: int, batch: int, work: Path) -> None:
        secret = uuid.uuid4().hex
        self.config = EmbeddedEngineConfig(
            model_dir=model_dir, cluster_secret=secret, ready_file=work / "ready.json", num_threads=threads,
            max_batch_size=max(32, batch), log_level="warning",
        )
        self.process = spawn(EMBEDDED, self.config)
        url = wait_ready(self.config, self.process, timeout_s=300)
        self.client = httpx.Client(base_url=url, headers={SECRET_HEADER: secret}, timeout=600)
        self.pool = ThreadPoolExecutor(batch)

    def _one(self, prompt: list[int], max_tokens: int) -> list[int]:
        body = dict(prompt_token_ids=prompt, max_tokens=max_tokens, temperature=0.0, stop_at_eos=False)
        response = self.client.post(ROUTE_GENERATE, json=body)
        response.raise_for_status()
        return response.json()["sequences"][0]["token_ids"]

    def run(self, prompts, max_tokens: int) -> list[list[int]]:
        return list(self.pool.map(lambda p: self._one(p, max_tokens), prompts))

    def stats(self) -> dict:
        return self.client.get("/health").json()["stats"]

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()
        stop(self.process, EMBEDDED.stop_timeout_s)


class HfRunner:
    """HF `model.generate` on one left-padded batch, in this process."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        self.model.generation_config.eos_token_id = None  # always max_tokens, like stop_at_eos=False
        self.pad = self.model.config.pad_token_id or 0

    @torch.no_grad()
    def run(self, prompts, max_tokens: int) -> list[list[int]]:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = self.model.generate(
            ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False, pad_token_id=self.pad
        )
        return out[:, width:].tolist()


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench", help="tx.models.tiny preset (tiny | bench)")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent requests = HF batch size")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=[16, 48], metavar=("MIN", "MAX"))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tx-bench-") as tmp:
        work = Path(tmp)
        model_dir = write_tiny_text_model(work / "model", preset=args.preset)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        prompts = make_prompts(args.concurrency, *args.prompt_len, vocab=min(vocab, 2000), seed=0)
        engine = EngineRunner(model_dir, args.threads, args.concurrency, work)
        try:
            hf = HfRunner(model_dir, args.threads)
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
        "preset": args.preset, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
        "prompt_len": args.prompt_len, "threads": args.threads, "repeats": args.repeats,
        "engine_tokens_per_s": round(tps["engine"]["median"], 1),
        "hf_generate_tokens_per_s": round(tps["hf"]["median"], 1),
        "ratio": round(tps["engine"]["median"] / tps["hf"]["median"], 3),
        "ratio_best_of_runs": round(tps["engine"]["best"] / tps["hf"]["best"], 3),
        "engine_seconds": [round(x, 3) for x in seconds["engine"]],
        "hf_seconds": [round(x, 3) for x in seconds["hf"]],
        "greedy_outputs_identical": f"{same}/{args.concurrency}",
        "engine_stats": stats,
    }, indent=2))


if __name__ == "__main__":
    main()
