"""Large chat bodies sent as a flooding client sends them (the load test's and scripts/bench/chat_flood.py's):
`--messages` turns of words, to the playground and to `/oai` chat completions in turns; each is refused (the
prompt cannot fit a tiny model's context) after the server has parsed it and a prompt worker has weighed it."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter

import httpx

WORDS = "the model token server batch loss step sample prompt answer engine weight gradient memory".split()
ROUTES = ("/api/v1/console/playground/sample", "/oai/api/v1/chat/completions")


def chat_turns(messages: int, chars: int, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"role": "user" if i % 2 == 0 else "assistant",
             "content": " ".join(rng.choice(WORDS) for _ in range(chars // 5))[:chars]} for i in range(messages)]


def flood(url: str, key: str, model: str, turns: list[dict[str, str]], stop: threading.Event, answers: Counter,
          first: int = 0) -> list[float]:
    """Until `stop`: one chat body after another, alternating routes; counts the answers by route and status,
    returns the round trips (s)."""
    body = json.dumps({"model": model, "messages": turns, "max_tokens": 8})
    trips = []
    with httpx.Client(timeout=120, headers={"X-API-Key": key, "Authorization": f"Bearer {key}",
                                            "Content-Type": "application/json"}) as http:
        n = first
        while not stop.is_set():
            route = ROUTES[n % 2]
            began = time.perf_counter()
            reply = http.post(f"{url}{route}", content=body)
            trips.append(time.perf_counter() - began)
            answers[f"{route} {reply.status_code}"] += 1
            n += 1
    return trips
