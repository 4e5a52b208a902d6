"""Benchmark: the embedded engine's sleep and wake, for level 1 (stash weights to a private file) and level 2
(drop them; wake reloads the base from the model dir).

For each level and each cycle: seconds of `POST /sleep` and of `POST /wake_up`, the engine process's RSS
(`/proc/<pid>/status` VmRSS) awake, asleep and awake again, so bytes freed against the model's weight bytes,
and whether a greedy generation after the wake equals the one before the sleep. The levels are interleaved
(1, 2, 1, 2, ...) so load from other jobs hits both alike; figures are medians. Prints one JSON object.

    python scripts/bench/engine_sleep.py [--preset bench] [--cycles 3] [--threads 2]
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


def settle_rss(pid: int, wait_s: float = 0.3) -> int:
    time.sleep(wait_s)  # let the allocator and the kernel catch up before reading RSS
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


def cycle(client: httpx.Client, pid: int, level: int, reference: dict, max_tokens: int) -> dict:
    awake = settle_rss(pid)
    sleep_s, state = timed_post(client, ROUTE_SLEEP, {"level": level})
    assert state["sleeping_level"] == level, state
    asleep = settle_rss(pid)
    wake_s, state = timed_post(client, ROUTE_WAKE_UP, {})
    assert state["sleeping_level"] == 0, state
    first_start = time.perf_counter()
    after = generate(client, max_tokens)
    first_generate_s = time.perf_counter() - first_start
    woken = settle_rss(pid)
    return {
        "sleep_s": sleep_s, "wake_s": wake_s, "first_generate_after_wake_s": first_generate_s,
        "rss_awake": awake, "rss_asleep": asleep, "rss_woken": woken, "freed": awake - asleep,
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
        "rss_awake_mib_median": round(med("rss_awake") / 2**20, 1),
        "rss_asleep_mib_median": round(med("rss_asleep") / 2**20, 1),
        "rss_woken_mib_median": round(med("rss_woken") / 2**20, 1),
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
    parser.add_argument("--cycles", type=int, default=3, help="sleep/wake cycles per level")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens of the before/after generation")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tx-bench-sleep-") as tmp:
        work = Path(tmp)
        model_dir = write_tiny_text_model(work / "model", preset=args.preset)
        weights = weight_bytes(model_dir)
        stash = work / "stash"
        stash.mkdir(mode=0o700)
        secret = uuid.uuid4().hex
        config = EmbeddedEngineConfig(
            model_dir=model_dir, cluster_secret=secret, ready_file=work / "ready.json", stash_dir=stash,
            num_threads=args.threads, log_level="warning",
        )
        process = spawn(EMBEDDED, config)
        try:
            url = wait_ready(config, process, timeout_s=300)
            with httpx.Client(base_url=url, headers={SECRET_HEADER: secret}, timeout=600) as client:
                reference = generate(client, args.max_tokens)  # also warms the engine up
                generate(client, args.max_tokens)
                results: dict[int, list[dict]] = {1: [], 2: []}
                for _ in range(args.cycles):
                    for level in (1, 2):
                        results[level].append(cycle(client, process.pid, level, reference, args.max_tokens))
        finally:
            stop(process, EMBEDDED.stop_timeout_s)

    print(json.dumps({
        "preset": args.preset, "threads": args.threads, "cycles": args.cycles,
        "weight_bytes": weights, "weight_mib": round(weights / 2**20, 1),
        "level_1": summarize(results[1], weights),
        "level_2": summarize(results[2], weights),
    }, indent=2))


if __name__ == "__main__":
    main()
