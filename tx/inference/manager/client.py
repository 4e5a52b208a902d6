"""InferenceClient: engine URLs plus the cluster secret; picklable, usable from any process.

Data plane: `generate` goes to one engine chosen by the router from `X-Session-ID`, and a request
that a pause aborted is resent with the tokens generated so far until it completes, so the caller
always receives one whole answer. Control plane: `fan_out` sends one call to every engine with a
timeout and reports which engines failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tx.inference.manager.router import Router
from tx.inference.protocol import (
    ROUTE_GENERATE,
    SECRET_HEADER,
    GeneratedSequence,
    GenerateRequest,
    GenerateResponse,
    error_detail,
)

MAX_ABORT_ROUNDS = 64


class EngineUnavailable(RuntimeError):
    """The engine could not be reached (dead process, refused connection, timeout)."""

    def __init__(self, name: str, cause: str) -> None:
        super().__init__(f"engine {name} unavailable: {cause}")
        self.name = name


class EngineRequestError(RuntimeError):
    """The engine answered with an error status."""

    def __init__(self, name: str, status: int, detail: str) -> None:
        super().__init__(f"engine {name} answered {status}: {detail}")
        self.name, self.status, self.detail = name, status, detail


@dataclass
class InferenceClient:
    engines: dict[str, str]  # stable engine name -> base URL
    secret: str
    timeout_s: float = 600.0
    _http: httpx.AsyncClient | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"engines": dict(self.engines), "secret": self.secret, "timeout_s": self.timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    @property
    def router(self) -> Router:
        return Router(sorted(self.engines))

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(headers={SECRET_HEADER: self.secret}, timeout=self.timeout_s)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def post(self, name: str, path: str, body: dict[str, Any] | None, timeout_s: float | None = None,
                   headers: dict[str, str] | None = None) -> dict[str, Any]:
        url = self.engines[name] + path
        try:
            response = await self._client().post(url, json=body, timeout=timeout_s or self.timeout_s,
                                                 headers=headers)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(name, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise EngineRequestError(name, response.status_code, error_detail(response))
        return response.json()

    async def get(self, name: str, path: str, timeout_s: float) -> dict[str, Any]:
        return await self._request("GET", name, path, timeout_s)

    async def delete(self, name: str, path: str, timeout_s: float) -> dict[str, Any]:
        return await self._request("DELETE", name, path, timeout_s)

    async def _request(self, method: str, name: str, path: str, timeout_s: float) -> dict[str, Any]:
        try:
            response = await self._client().request(method, self.engines[name] + path, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(name, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise EngineRequestError(name, response.status_code, error_detail(response))
        return response.json()

    async def fan_out(self, path: str, body: dict[str, Any] | None, timeout_s: float,
                      names: list[str] | None = None) -> dict[str, dict[str, Any] | BaseException]:
        """One call to each engine at once; per engine, its JSON answer or the exception it raised."""
        names = list(self.engines) if names is None else names
        results = await asyncio.gather(
            *(self.post(n, path, body, timeout_s) for n in names), return_exceptions=True
        )
        return dict(zip(names, results))

    async def generate(self, engine: str, session_key: str, request: GenerateRequest,
                       on_abort: Callable[[], Awaitable[None]] | None = None) -> GenerateResponse:
        """Generate on `engine`, resending aborted sequences until each one is complete. `on_abort` runs once
        before the resends of each round (e.g. to wait until the engine may run again)."""
        headers = {"X-Session-ID": session_key}
        first = GenerateResponse.model_validate(
            await self.post(engine, ROUTE_GENERATE, request.model_dump(), headers=headers)
        )
        resume = _Resume(on_abort)
        sequences = await asyncio.gather(*(
            self._complete(engine, headers, request, index, seq, resume) if seq.stop_reason == "abort"
            else _done(seq)
            for index, seq in enumerate(first.sequences)
        ))
        return first.model_copy(update={"sequences": list(sequences)})

    async def _complete(self, engine: str, headers: dict[str, str], request: GenerateRequest, index: int,
                        partial: GeneratedSequence, resume: _Resume) -> GeneratedSequence:
        """Resend sample `index` with its tokens so far until it ends. A seeded resend after k tokens uses
        `seed + index + k * n`: a seed of its own (sample j of the request uses seed + j, and two samples
        aborted after the same k must not share a random stream), and the same one for the same abort."""
        tokens, logprobs = list(partial.token_ids), list(partial.logprobs)
        for _ in range(MAX_ABORT_ROUNDS):
            await resume()
            remaining = request.max_tokens - len(tokens)
            if remaining <= 0:
                return GeneratedSequence(token_ids=tokens, logprobs=logprobs, stop_reason="length")
            resend = request.model_copy(update={
                "prompt_token_ids": request.prompt_token_ids + tokens, "n": 1, "max_tokens": remaining,
                "prompt_logprobs": False, "topk_prompt_logprobs": 0, "prompt_logprobs_last_n": None,
                "seed": None if request.seed is None else request.seed + index + len(tokens) * request.n,
                "resumed_tokens": request.resumed_tokens + len(tokens),
            })
            answer = GenerateResponse.model_validate(
                await self.post(engine, ROUTE_GENERATE, resend.model_dump(), headers=headers)
            )
            piece = answer.sequences[0]
            tokens += piece.token_ids
            logprobs += piece.logprobs
            if piece.stop_reason != "abort":
                return GeneratedSequence(token_ids=tokens, logprobs=logprobs, stop_reason=piece.stop_reason)
        raise EngineRequestError(engine, 503, f"request still aborted after {MAX_ABORT_ROUNDS} resends")


class _Resume:
    """`on_abort` for the aborted sequences of one request, one at a time (the first caller does the waiting)."""

    def __init__(self, on_abort: Callable[[], Awaitable[None]] | None) -> None:
        self.on_abort = on_abort
        self.lock = asyncio.Lock()

    async def __call__(self) -> None:
        if self.on_abort is not None:
            async with self.lock:
                await self.on_abort()


async def _done(sequence: GeneratedSequence) -> GeneratedSequence:
    return sequence
