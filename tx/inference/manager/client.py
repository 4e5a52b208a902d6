"""InferenceClient: engine URLs plus the cluster secret; picklable, usable from any process.

Data plane: `sample` (the domain's request in, its result out: the engine client's edge) and `generate` (the
contract's request) go to the engine the caller names (the manager picks it, sticky per sampler; the
session key travels as `X-Session-ID`); a request that a pause aborted is resent until it completes
(`resume.py`), so the caller always receives one whole answer. Control plane: `fan_out` sends one call to
every engine with a timeout and reports which engines failed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx

from tx.inference.manager.resume import StillAborted, Wait, complete
from tx.inference.manager.samples import generate_request, sample_result
from tx.inference.protocol import (
    ROUTE_GENERATE,
    ROUTE_GENERATE_STREAM,
    SECRET_HEADER,
    GenerateRequest,
    GenerateResponse,
    error_detail,
)
from tx.inference.protocol.stream import GenerateEvent
from tx.types import SampleRequest, SampleResult, TokenListener


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
                       on_abort: Wait | None = None, on_tokens: TokenListener | None = None) -> GenerateResponse:
        """Generate on `engine`; sequences a pause aborted are resent until each one is complete (the policy:
        `resume.py`). `on_abort` runs before each round of resends (to wait until the engine may run again).
        With `on_tokens`, the engine streams: it hears each sample's tokens as they are generated (a resent
        sample's rest in one piece, once it is complete)."""
        headers = {"X-Session-ID": session_key}

        async def send(body: GenerateRequest) -> GenerateResponse:
            return GenerateResponse.model_validate(
                await self.post(engine, ROUTE_GENERATE, body.model_dump(), headers=headers))

        if on_tokens is None:
            first = await send(request)
        else:
            first = await self._stream(engine, request, headers, on_tokens)
        try:
            answer = await complete(send, request, first, on_abort)
        except StillAborted as exc:
            raise EngineRequestError(engine, 503, str(exc)) from exc
        if on_tokens is not None:
            for index, (cut, whole) in enumerate(zip(first.sequences, answer.sequences)):
                if len(whole.token_ids) > len(cut.token_ids):
                    on_tokens(index, whole.token_ids[len(cut.token_ids):], whole.logprobs[len(cut.token_ids):])
        return answer

    async def _stream(self, name: str, request: GenerateRequest, headers: dict[str, str],
                      on_tokens: TokenListener) -> GenerateResponse:
        """One call of the stream route: deltas to `on_tokens`, the answer returned."""
        url = self.engines[name] + ROUTE_GENERATE_STREAM
        try:
            async with self._client().stream("POST", url, json=request.model_dump(), headers=headers) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise EngineRequestError(name, response.status_code, error_detail(response))
                async for line in response.aiter_lines():
                    if not line:
                        continue
                    event = GenerateEvent.model_validate_json(line)
                    for delta in event.deltas:
                        on_tokens(delta.index, delta.token_ids, delta.logprobs)
                    if event.error_status is not None:
                        raise EngineRequestError(name, event.error_status, event.error_detail or "")
                    if event.result is not None:
                        return event.result
        except httpx.HTTPError as exc:
            raise EngineUnavailable(name, f"{type(exc).__name__}: {exc}") from exc
        raise EngineUnavailable(name, "the stream ended before the answer")

    async def sample(self, engine: str, session_key: str, request: SampleRequest, adapter: str | None,
                     on_abort: Wait | None = None, cache_namespace: str | None = None,
                     on_tokens: TokenListener | None = None) -> SampleResult:
        """The domain's sample on `engine` (with `adapter`, or the base model; in its own prefix-cache namespace
        if given): this client is its edge, where the request becomes the engine contract's and the answer the
        domain's result. `on_tokens`: stream (`generate`)."""
        generate = generate_request(request, adapter, cache_namespace)
        answer = await self.generate(engine, session_key, generate, on_abort, on_tokens)
        return sample_result(answer, request)
