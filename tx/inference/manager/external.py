"""External engines: engines someone else started (`tx engine serve`, or tx's vLLM engine), given to
`tx serve` by URL (`--engine-url`, `--engine-secret`).

Design / who owns what:
- tx never starts, stops or sleeps them, and they never count as colocated. It only samples from them and
  pushes weights into them, like into the engines it starts.
- Each one belongs to the served base model whose fingerprint (`tx.models.fingerprint`) its `/health`
  reports: one URL list serves every base model, and an engine of another model is refused.
- At startup every URL is checked (`check_at_startup`); each problem is one line naming the URL: unreachable,
  an old contract (no or another `contract_version`), a model tx does not serve, no usable weight transport,
  room for fewer weight versions than tx keeps per engine, or a wrong cluster secret (a guarded call that
  changes nothing answers 401). All problems come in one `ExternalEngineError`, so a user fixes them in one go.
- While serving (`ExternalEngines`, `external_watch.py`, which the supervisor owns): an engine that stops answering (a request, or the `/health` asked of every
  engine that is up every `probe_interval_s`) is marked down (requests go to the other engines of its group) and
  probed every `probe_interval_s` with the same checks. Once it passes, it rejoins
  as a new engine: no transfer group, no weight versions (the versions it still holds are unloaded before its
  first use, so it never samples weights tx did not push to it); each version is pushed again before it
  samples it. The same cleanup runs on first use after tx starts (versions a previous tx left there).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from dataclasses import dataclass
from pathlib import Path

import httpx

from tx.inference.protocol import CONTRACT_VERSION, ROUTE_HEALTH, ROUTE_TOKENIZE, SECRET_HEADER

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 10.0
USABLE_TRANSPORTS = ("gloo", "nccl")  # CUDA IPC alone needs the trainer's own GPU: not an engine elsewhere


class ExternalEngineError(RuntimeError):
    """One or more external engines failed their checks; the message has one line per problem."""


@dataclass(frozen=True)
class ExternalEngine:
    url: str  # as given (`tx.config` drops a trailing slash)
    base_model: str  # the served base model it belongs to
    fingerprint: str  # that model's


@dataclass
class ExternalHandle:
    """An external engine in its slot (an `EngineHandle` with no process): `up` is what tx last saw of it."""

    name: str
    url: str
    fingerprint: str
    up: bool = True
    joined: bool = False  # its leftover weight versions were unloaded since it (re)joined
    problem: str | None = None  # why it is down
    rejoins: int = 0

    @property
    def alive(self) -> bool:
        return self.up

    @property
    def pid(self) -> None:
        return None

    @property
    def state(self) -> str:
        return "up" if self.up else "down"


def health_problem(health: dict, fingerprints: dict[str, str],
                   max_adapters: int = 1) -> tuple[str | None, str | None]:
    """(the base model this engine serves, None) or (None, what is wrong), from its `/health` answer.
    `max_adapters`: the weight versions tx keeps loaded per engine (the engine must hold as many)."""
    version = health.get("contract_version")
    if version != CONTRACT_VERSION:
        have = "none (older than version 1)" if version is None else f"version {version}"
        return None, (f"speaks engine contract {have}, this tx speaks version {CONTRACT_VERSION}: "
                      "upgrade tx on the engine's machine")
    fingerprint = health.get("model_fingerprint")
    matches = [name for name, fp in fingerprints.items() if fp == fingerprint]
    if not matches:
        served = ", ".join(f"{n} ({fp})" for n, fp in fingerprints.items())
        return None, (f"serves model {health.get('model')!r} (fingerprint {fingerprint}), which is none of the "
                      f"base models this server serves: {served}")
    transports = health.get("weight_transports") or []
    if not any(t in USABLE_TRANSPORTS for t in transports):
        return None, f"takes no weight transport tx can push over from another process ({transports})"
    holds = health.get("max_adapters")
    if holds is not None and holds < max_adapters:
        return None, (f"holds at most {holds} weight versions and tx keeps {max_adapters} loaded per engine: start "
                      f"it with --max-adapters {max_adapters}, or give tx serve --engine-max-adapters {holds}")
    return matches[0], None


async def probe(http: httpx.AsyncClient, url: str, secret: str, fingerprints: dict[str, str],
                max_adapters: int = 1) -> tuple[str | None, str | None]:
    """Check one engine: (its base model, None) when it is fit to serve, else (None, the problem)."""
    try:
        answer = await http.get(url + ROUTE_HEALTH, timeout=CHECK_TIMEOUT_S)
        if answer.status_code != 200:
            return None, f"answered {answer.status_code} to GET {ROUTE_HEALTH}: {answer.text[:200]}"
        base_model, problem = health_problem(answer.json(), fingerprints, max_adapters)
        if problem is not None:
            return None, problem
        guarded = await http.post(url + ROUTE_TOKENIZE, json={"text": ""}, timeout=CHECK_TIMEOUT_S,
                                  headers={SECRET_HEADER: secret})
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"is unreachable ({type(exc).__name__}: {exc})"
    if guarded.status_code == 401:
        return None, "refused the cluster secret: give tx serve the engine's secret (--engine-secret / " \
                     "TX_ENGINE_SECRET)"
    return base_model, None


def check_at_startup(urls: list[str], secret: str | None, models: dict[str, Path],
                     max_adapters: int = 1) -> list[ExternalEngine]:
    """Every URL checked at once; the engines with their base models, or ExternalEngineError listing each
    problem. Blocking (it runs its own event loop in a thread): call it while the server starts."""
    if not urls:
        return []
    if not secret:
        raise ExternalEngineError("--engine-url needs the engines' cluster secret: --engine-secret or "
                                  "TX_ENGINE_SECRET")
    from tx.models.fingerprint import model_fingerprint

    fingerprints = {name: model_fingerprint(path) for name, path in models.items()}

    async def check_all() -> list[tuple[str | None, str | None]]:
        async with httpx.AsyncClient() as http:
            return await asyncio.gather(*(probe(http, url, secret, fingerprints, max_adapters) for url in urls))

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its own loop, also when called inside one
        results = pool.submit(asyncio.run, check_all()).result()
    problems = [f"engine {url} {problem}" for url, (_, problem) in zip(urls, results) if problem is not None]
    if problems:
        raise ExternalEngineError("external engines failed their startup checks:\n  " + "\n  ".join(problems))
    fit = [(url, base_model) for url, (base_model, _) in zip(urls, results) if base_model is not None]  # all of them
    return [ExternalEngine(url, base_model, fingerprints[base_model]) for url, base_model in fit]


__all__ = ["ExternalEngine", "ExternalEngineError", "ExternalHandle", "check_at_startup", "health_problem", "probe"]
