"""/healthz latency while clients flood the chat routes with large bodies (issue 38 item 4's load).

One `tx serve` on the tiny Qwen3; `--clients` threads send chat bodies of `--messages` x `--chars` characters
of words, in turns to the playground (`/api/v1/console/playground/sample`) and to `/oai/api/v1/chat/completions`
(each refused: the prompt cannot fit the tiny model's context), while one more thread asks `/api/v1/healthz`
every 20 ms. Prints JSON: the health latencies (p50, p99, max, ms) idle and under the flood, the chat answers
by status, the chat round trips (median, ms), and the load average.

    python scripts/bench/chat_flood.py [--clients 4] [--messages 64] [--chars 8000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from chat_bodies import chat_turns, flood  # noqa: E402
from txserver import TxServer  # noqa: E402

KEY = "tml-flood"


def health(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(timeout=10) as http:
        while not stop.is_set():
            start = time.perf_counter()
            http.get(f"{url}/api/v1/healthz").raise_for_status()
            out.append((time.perf_counter() - start) * 1000)
            time.sleep(0.02)


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered), 1),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
            "max_ms": round(ordered[-1], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--messages", type=int, default=64)
    parser.add_argument("--chars", type=int, default=8000)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    turns = chat_turns(args.messages, args.chars)
    with tempfile.TemporaryDirectory(prefix="tx-flood-") as tmp, TxServer(Path(tmp) / "data") as server:
        idle: list[float] = []
        stop = threading.Event()
        probe = threading.Thread(target=health, args=(server.url, stop, idle))
        probe.start()
        time.sleep(min(5.0, args.seconds / 4))
        stop.set()
        probe.join()
        loaded: list[float] = []
        statuses: Counter = Counter()
        trips: list[float] = []
        stop = threading.Event()
        threads = [threading.Thread(target=lambda i=i: trips.extend(flood(server.url, KEY, "tiny-qwen3", turns, stop,
                                                                          statuses, first=i)))
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(2.0)  # the flood is under way (and the prompt workers have loaded their tokenizers)
        probe = threading.Thread(target=health, args=(server.url, stop, loaded))
        probe.start()
        time.sleep(args.seconds)
        stop.set()
        for t in [*threads, probe]:
            t.join()
    body_bytes = len(json.dumps({"model": "tiny-qwen3", "messages": turns}))
    print(json.dumps({"clients": args.clients, "body_bytes": body_bytes, "healthz_idle": summary(idle),
                      "healthz_flooded": summary(loaded), "chat_answers": dict(statuses),
                      "chat_round_trip_median_ms": round(statistics.median(trips) * 1000, 1) if trips else None,
                      "load_average": os.getloadavg()[0]}, indent=1))


if __name__ == "__main__":
    main()
