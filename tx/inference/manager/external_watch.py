"""The supervision of external engines while tx serves (owned by the supervisor): down, probe, rejoin.

An engine that stops answering (a request, or the `/health` asked of every engine that is up every
`probe_interval_s`) is marked down and probed with the startup checks (`external.py`) until it is fit again;
it then rejoins as a new engine (`ensure_joined` unloads what it still holds before its first use).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx

from tx.inference.manager.client import EngineRequestError, EngineUnavailable, InferenceClient
from tx.inference.manager.external import CHECK_TIMEOUT_S, ExternalHandle, probe
from tx.inference.protocol import ROUTE_ADAPTER, ROUTE_HEALTH

if TYPE_CHECKING:
    from tx.inference.manager.groups import EngineSlot

logger = logging.getLogger(__name__)


class ExternalEngines:
    """Down, probe, rejoin: the supervision of external engines (tx never starts or stops them)."""

    def __init__(self, client: InferenceClient, probe_interval_s: float, control_timeout_s: float,
                 forget: Callable[[EngineSlot], None], max_adapters: int = 1) -> None:
        self.client = client
        self._forget = forget  # the publisher's: the engine holds nothing tx pushed
        self.max_adapters = max_adapters
        self.probe_interval_s = probe_interval_s
        self.control_timeout_s = control_timeout_s
        self._probes: dict[str, asyncio.Task] = {}
        self._watch: asyncio.Task | None = None
        self._http: httpx.AsyncClient | None = None

    def watch(self, loop: asyncio.AbstractEventLoop, slots: list[EngineSlot]) -> None:
        """Ask every engine that is up for `/health` every `probe_interval_s`, and mark down one that does not
        answer: a dead engine leaves routing (and publishes) even when no request meets it."""
        if slots and self._watch is None:
            self._watch = loop.create_task(self._watch_up(slots))

    async def _watch_up(self, slots: list[EngineSlot]) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            up = [(slot, handle) for slot in slots if (handle := slot.external_handle) is not None and handle.up]
            answers = await asyncio.gather(*(self._http_client().get(handle.url + ROUTE_HEALTH,
                                                                      timeout=CHECK_TIMEOUT_S) for _, handle in up),
                                           return_exceptions=True)
            for (slot, _), answer in zip(up, answers):
                if isinstance(answer, httpx.HTTPError):
                    self.mark_down(slot, f"GET {ROUTE_HEALTH} failed: {type(answer).__name__}: {answer}")

    def _http_client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient()
        return self._http

    async def ensure_joined(self, slot: EngineSlot) -> None:
        """Ready to use, or EngineUnavailable if it is down. Call with the slot's lock held."""
        handle = slot.process
        assert isinstance(handle, ExternalHandle)
        if not handle.up:
            raise EngineUnavailable(slot.name, f"external engine {handle.url} is down: {handle.problem}")
        if handle.joined:
            return
        try:
            health = await self.client.get(slot.name, ROUTE_HEALTH, self.control_timeout_s)
            for name in health.get("adapters") or {}:  # not pushed by this tx (or not since it rejoined)
                await self.client.delete(slot.name, ROUTE_ADAPTER.format(name=name), self.control_timeout_s)
        except EngineRequestError as exc:
            raise EngineUnavailable(slot.name, f"could not unload old weight versions: {exc}") from exc
        self._forget(slot)
        handle.joined = True

    def mark_down(self, slot: EngineSlot, reason: str) -> None:
        """Take it out of routing and probe it until it is fit again (once, however many callers saw it fail)."""
        handle = slot.process
        assert isinstance(handle, ExternalHandle)
        if handle.up:
            logger.warning("external engine %s (%s) is down: %s; probing it every %g s", slot.name, handle.url,
                           reason, self.probe_interval_s)
            handle.up, handle.joined, handle.problem = False, False, reason
        if slot.name not in self._probes:
            task = asyncio.create_task(self._probe_until_fit(slot, handle))
            self._probes[slot.name] = task
            task.add_done_callback(lambda _: self._probes.pop(slot.name, None))

    async def _probe_until_fit(self, slot: EngineSlot, handle: ExternalHandle) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            _, problem = await probe(self._http_client(), handle.url, self.client.secret, {"": handle.fingerprint},
                                     self.max_adapters)
            if problem is None:
                break
            handle.problem = problem
        async with slot.lock:
            self._forget(slot)  # a new engine as far as tx knows: its transfer group and versions are gone
            handle.up, handle.joined, handle.problem = True, False, None
            handle.rejoins += 1
        logger.info("external engine %s (%s) is fit again and rejoins", slot.name, handle.url)

    async def close(self) -> None:
        for task in [*self._probes.values(), *([self._watch] if self._watch else [])]:
            task.cancel()
        if self._http is not None:
            await self._http.aclose()
