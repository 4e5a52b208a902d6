"""The server's cost of waiting for samples: one retrieve_future long-poll per sample (the default) against
the session poller (`sample_use_retrieve_futures`: one retrieve_futures long-poll per sampling client, then
one retrieve_future per finished sample to fetch it).

For each mode it starts `tx serve` (the built-in tiny model, TX_SAMPLE_USE_RETRIEVE_FUTURES=0|1), creates
--samplers sampling clients, warms them up, then runs --rounds rounds in which every client has one sample in
flight at once. It reads the API server process's own CPU time (user + sys, not the engine's) before and after,
and counts the sampling requests the SDK sent per route (asample, retrieve_future, retrieve_futures;
httpx.AsyncClient.send, wrapped in this process only).
Prints one JSON object.

    python scripts/bench/retrieve_futures.py [--samplers 64] [--rounds 4] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import tinker
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from txserver import API_KEY, TxServer  # noqa: E402

SENT: collections.Counter = collections.Counter()
_send = httpx.AsyncClient.send


async def _counting_send(self, request: httpx.Request, *args, **kwargs):
    SENT[request.url.path.rsplit("/api/v1/", 1)[-1]] += 1
    return await _send(self, request, *args, **kwargs)


httpx.AsyncClient.send = _counting_send  # the SDK's requests, counted by route


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def run_mode(use_retrieve_futures: bool, args: argparse.Namespace, tmp: Path) -> dict:
    server = TxServer(tmp / f"data-{int(use_retrieve_futures)}",
                      env={"TX_SAMPLE_USE_RETRIEVE_FUTURES": str(int(use_retrieve_futures))})
    server.start()
    try:
        client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
        samplers = [client.create_sampling_client(base_model="tiny-qwen3").result() for _ in range(args.samplers)]
        prompt = types.ModelInput.from_ints(list(range(10, 26)))
        params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0)

        def round_() -> None:
            futures = [s.sample(prompt, 1, params) for s in samplers]
            for f in futures:
                assert len(f.result().sequences) == 1

        round_()  # warm-up: the engine starts, every client's poller (if any) is running
        SENT.clear()
        cpu_before, start = cpu_seconds(server.proc.pid), time.perf_counter()
        for _ in range(args.rounds):
            round_()
        wall, cpu = time.perf_counter() - start, cpu_seconds(server.proc.pid) - cpu_before
        routes = collections.Counter({k: v for k, v in SENT.items() if "retrieve_future" in k or k == "asample"})
        client.close("success").result()
    finally:
        server.stop()
    samples = args.samplers * args.rounds
    return {
        "samples": samples,
        "wall_s": round(wall, 2),
        "api_cpu_s": round(cpu, 2),
        "api_cpu_ms_per_sample": round(1000 * cpu / samples, 2),
        "requests_per_sample": {k: round(v / samples, 2) for k, v in sorted(routes.items())},
        "requests_per_sample_total": round(sum(routes.values()) / samples, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samplers", type=int, default=64, help="sampling clients, each with one sample in flight")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tx-bench-rf-") as tmp:
        per_sample = run_mode(False, args, Path(tmp))
        session_poller = run_mode(True, args, Path(tmp))
    print(json.dumps({
        "samplers": args.samplers, "rounds": args.rounds, "max_tokens": args.max_tokens,
        "retrieve_future_per_sample": per_sample,
        "retrieve_futures_session_poller": session_poller,
        "api_cpu_ratio_poller_over_per_sample": round(
            session_poller["api_cpu_s"] / max(per_sample["api_cpu_s"], 1e-9), 2),
    }, indent=2))


if __name__ == "__main__":
    main()
