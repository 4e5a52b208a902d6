"""External engines: engines someone else started (`tx engine serve`, or tx's vLLM engine), given to
`tx serve` by URL (`--engine-url`, `--engine-secret`).

Design / who owns what:
- tx never starts, stops or sleeps them, and they never count as colocated. It only samples from them and
  pushes weights into them, like into the engines it starts.
- Each one belongs to the served base model whose fingerprint (`tx.models.fingerprint`) its `/health`
  reports: one URL list serves every base model, and an engine of another model is refused.
- At startup every URL is checked (`check_at_startup`); each problem is one line naming the URL: unreachable,
  an old contract (no or another `contract_version`), a model tx does not serve, no usable weight transport,
  or a wrong cluster secret (a guarded call that changes nothing answers 401). All problems come in one
  `ExternalEngineError`, so a user fixes them in one go.
- While serving, the manager marks an engine that stops answering as down and probes it again with
  `probe` (the same checks, async) until it is healthy; see `tx/inference/manager.py`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass
from pathlib import Path

import httpx

from tx.inference.protocol import CONTRACT_VERSION, ROUTE_HEALTH, ROUTE_TOKENIZE, SECRET_HEADER

CHECK_TIMEOUT_S = 10.0
USABLE_TRANSPORTS = ("gloo", "nccl")  # CUDA IPC alone needs the trainer's own GPU: not an engine elsewhere


class ExternalEngineError(RuntimeError):
    """One or more external engines failed their checks; the message has one line per problem."""


@dataclass(frozen=True)
class ExternalEngine:
    url: str  # as given (`tx.config` drops a trailing slash)
    base_model: str  # the served base model it belongs to


def health_problem(health: dict, fingerprints: dict[str, str]) -> tuple[str | None, str | None]:
    """(the base model this engine serves, None) or (None, what is wrong), from its `/health` answer."""
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
    return matches[0], None


async def probe(http: httpx.AsyncClient, url: str, secret: str,
                fingerprints: dict[str, str]) -> tuple[str | None, str | None]:
    """Check one engine: (its base model, None) when it is fit to serve, else (None, the problem)."""
    try:
        answer = await http.get(url + ROUTE_HEALTH, timeout=CHECK_TIMEOUT_S)
        if answer.status_code != 200:
            return None, f"answered {answer.status_code} to GET {ROUTE_HEALTH}: {answer.text[:200]}"
        base_model, problem = health_problem(answer.json(), fingerprints)
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


def check_at_startup(urls: list[str], secret: str | None, models: dict[str, Path]) -> list[ExternalEngine]:
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
            return await asyncio.gather(*(probe(http, url, secret, fingerprints) for url in urls))

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its own loop, also when called inside one
        results = pool.submit(asyncio.run, check_all()).result()
    problems = [f"engine {url} {problem}" for url, (_, problem) in zip(urls, results) if problem is not None]
    if problems:
        raise ExternalEngineError("external engines failed their startup checks:\n  " + "\n  ".join(problems))
    return [ExternalEngine(url, base_model) for url, (base_model, _) in zip(urls, results)]


__all__ = ["ExternalEngine", "ExternalEngineError", "check_at_startup", "health_problem", "probe"]
