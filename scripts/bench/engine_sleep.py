"""Benchmark: the embedded engine's sleep and wake, for level 1 (stash weights to a private file) and level 2
(drop them; wake reloads the base from the model dir).

For each level and each cycle: seconds of `POST /sleep` and of `POST /wake_up`, the memory in use awake, asleep
and awake again (on a CPU the engine process's RSS, `/proc/<pid>/status` VmRSS; on a GPU the device's memory in
use, which only the engine changes meanwhile), so bytes freed against the model's weight bytes, and whether a
greedy generation after the wake equals the one before the sleep. The levels are interleaved (1, 2, 1, 2, ...)
so load from other jobs hits both alike; figures are medians. Prints one JSON object.

The model: a tiny preset, a real shape with random weights (`--shape qwen3-8b`, scripts/bench/real_shapes.py)
or a local model (`--model DIR`); `--device cuda` puts the engine there (base in bfloat16, as tx serve does).

    python scripts/bench/engine_sleep.py [--preset bench] [--cycles 3] [--threads 2]
    python scripts/bench/engine_sleep.py --shape qwen3-8b --device cuda --cycles 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import torch
from real_shapes import SHAPES, write_random_model

from tx.inference.engines.embedded import EmbeddedEngineConfig
from tx.inference.engines.kinds import EMBEDDED
from tx.inference.launch.process import spawn, stop, wait_ready
from tx.inference.protocol import ROUTE_GENERATE, ROUTE_SLEEP, ROUTE_WAKE_UP, SECRET_HEADER
from tx.models.tiny import write_tiny_text_model

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1}
PROMPT = [5, 17, 230, 1000, 44, 321, 77, 2047]  # ids within every preset's vocabulary (tiny: 2,048)


def weight_bytes(model_dir: Path) -> int:
    """Bytes of every tensor in the model's safetensors files (read from their headers)."""
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in info["shape"]:
                count *= dim
            total += count * _DTYPE_BYTES[info["dtype"]]
    return total


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def in_use(pid: int, device: str, wait_s: float = 0.3) -> int:
    """The engine's memory: its RSS on a CPU, the device's memory in use on a GPU."""
    time.sleep(wait_s)  # let the allocator and the kernel catch up before reading
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        return total - free
    return rss_bytes(pid)


def timed_post(client: httpx.Client, path: str, body: dict) -> tuple[float, dict]:
    start = time.perf_counter()
    response = client.post(path, json=body)
    seconds = time.perf_counter() - start
    response.raise_for_status()
    return seconds, response.json()


def generate(client: httpx.Client, max_tokens: int) -> dict:
    body = dict(prompt_token_ids=PROMPT, max_tokens=max_tokens, temperature=0.0, stop_at_eos=False)
    response = client.post(ROUTE_GENERATE, json=body)
    response.raise_for_status()
    return response.json()["sequences"][0]


def cycle(client: httpx.Client, pid: int, device: str, level: int, reference: dict, max_tokens: int) -> dict:
    awake = in_use(pid, device)
    sleep_s, state = timed_post(client, ROUTE_SLEEP, {"level": level})
    assert state["sleeping_level"] == level, state
    asleep = in_use(pid, device)
    wake_s, state = timed_post(client, ROUTE_WAKE_UP, {})
    assert state["sleeping_level"] == 0, state
    first_start = time.perf_counter()
    after = generate(client, max_tokens)
    first_generate_s = time.perf_counter() - first_start
    woken = in_use(pid, device)
    return {
        "sleep_s": sleep_s, "wake_s": wake_s, "first_generate_after_wake_s": first_generate_s,
        "awake": awake, "asleep": asleep, "woken": woken, "freed": awake - asleep,
        "same_tokens": after["token_ids"] == reference["token_ids"],
        "max_logprob_diff": max(abs(a - b) for a, b in zip(after["logprobs"], reference["logprobs"])),
    }


def summarize(cycles: list[dict], weights: int) -> dict:
    def med(key: str) -> float:
        return statistics.median(c[key] for c in cycles)

    freed = med("freed")
    return {
        "sleep_s_median": round(med("sleep_s"), 4),
        "wake_s_median": round(med("wake_s"), 4),
        "first_generate_after_wake_s_median": round(med("first_generate_after_wake_s"), 4),
        "awake_mib_median": round(med("awake") / 2**20, 1),
        "asleep_mib_median": round(med("asleep") / 2**20, 1),
        "woken_mib_median": round(med("woken") / 2**20, 1),
        "freed_mib_median": round(freed / 2**20, 1),
        "freed_over_weight_bytes": round(freed / weights, 3),
        "generation_after_wake_identical": all(c["same_tokens"] for c in cycles),
        "max_logprob_diff": max(c["max_logprob_diff"] for c in cycles),
        "sleep_s": [round(c["sleep_s"], 4) for c in cycles],
        "wake_s": [round(c["wake_s"], 4) for c in cycles],
        "freed_mib": [round(c["freed"] / 2**20, 1) for c in cycles],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench", help="tx.models.tiny preset (tiny | bench)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="a real shape, random weights")
    parser.add_argument("--layers", type=int, default=None, help="with --shape: fewer layers")
    parser.add_argument("--model", type=Path, default=None, help="a local Hugging Face model")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--cycles", type=int, default=3, help="sleep/wake cycles per level")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens of the before/after generation")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tx-bench-sleep-") as tmp:
        work = Path(tmp)
        if args.model or args.shape:
            model_dir = args.model or write_random_model(args.shape, work / args.shape, args.device, args.layers)
        else:
            model_dir = write_tiny_text_model(work / "model", preset=args.preset)
        weights = weight_bytes(model_dir)
        stash = work / "stash"
        stash.mkdir(mode=0o700)
        secret = uuid.uuid4().hex
        config = EmbeddedEngineConfig(
            model_dir=model_dir, cluster_secret=secret, ready_file=work / "ready.json", stash_dir=stash,
            num_threads=args.threads, log_level="warning", device=args.device,
            dtype="bfloat16" if args.device.startswith("cuda") else "float32",
        )
        process = spawn(EMBEDDED, config)
        try:
            url = wait_ready(config, process, timeout_s=900)
            with httpx.Client(base_url=url, headers={SECRET_HEADER: secret}, timeout=600) as client:
                reference = generate(client, args.max_tokens)  # also warms the engine up
                generate(client, args.max_tokens)
                results: dict[int, list[dict]] = {1: [], 2: []}
                for _ in range(args.cycles):
                    for level in (1, 2):
                        results[level].append(
                            cycle(client, process.pid, args.device, level, reference, args.max_tokens))
        finally:
            stop(process, EMBEDDED.stop_timeout_s)

    print(json.dumps({
        "bench": "engine_sleep", "model": args.model.name if args.model else (args.shape or args.preset),
        "device": args.device,
        "memory": "device_in_use" if args.device.startswith("cuda") else "engine_rss",
        "threads": args.threads, "cycles": args.cycles,
        "weight_bytes": weights, "weight_mib": round(weights / 2**20, 1),
        "level_1": summarize(results[1], weights),
        "level_2": summarize(results[2], weights),
    }, indent=2))


if __name__ == "__main__":
    main()
