"""EngineManager: the façade the services call. Lazy engines, the colocated sleep/wake cycle, weight versions,
supervision, each in its own module:

- `groups.py`: the data (settings, one group of engine slots per served base model);
- `lifecycle.py`: group states (absent/starting/awake/asleep) and the lease that keeps engines awake in use;
- `versions.py`: weight versions (a counter, a new number at every sampler save) and the clients pinned to them;
- `publisher.py`: weight versions pushed into engines over the chosen transport, adapter eviction; the one owner
  of what each engine process holds;
- `supervisor.py`: engine processes started, restarted when they fail, stopped; external engines' liveness
  (`external_watch.py`; their startup checks: `external.py`);
- `client.py`: the engines' HTTP client, the edge where a domain `SampleRequest` becomes the contract's;
  `resume.py`: the abort/resume policy; `router.py`: sticky routing;
- `report.py`: what operators see;
- `selfcheck.py`: an engine checked against the trainer before its base model is first sampled.

Here: a sample is routed to one engine (sticky on the sampling session), its weights are made ready there, and
a request that met a dead engine is retried once on the restarted one, then failed with a server error. A
request that met an external engine that stopped answering is retried on another engine of the group (that one
is marked down and probed, `external_watch.py`), and fails with a server error when none is left.
Runs on the server's event loop; `training_pass` and `save_sampler` are the entry points for the training
thread, `pin` and `prestart` for request threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tx.inference.launch import EngineHandle, Launcher
from tx.inference.manager.client import EngineRequestError, EngineUnavailable, InferenceClient
from tx.inference.manager.external import ExternalEngine
from tx.inference.manager.groups import EngineGroup, EngineSettings, EngineSlot, GroupState, build_groups
from tx.inference.manager.lifecycle import Lifecycle
from tx.inference.manager.publisher import Publisher
from tx.inference.manager.report import describe_groups
from tx.inference.manager.selfcheck import Reference, Verdict, check_engine, check_prompts
from tx.inference.manager.supervisor import Supervisor
from tx.inference.manager.versions import VersionStore, WeightVersion, lora_spec, snapshot
from tx.types import SampleKey, SampleRequest, SampleResult, TokenListener, UserError

logger = logging.getLogger(__name__)

__all__ = ["EngineManager", "EngineSettings", "EngineSlot", "GroupState"]


def engine_error(exc: EngineRequestError) -> Exception:
    """What an engine's error answer means to the user: a 400 is about their request (a token outside the
    vocabulary, a prompt too long); anything else (an adapter the manager should have loaded, a wrong state,
    a schema the manager built) is the server's fault."""
    if exc.status == 400:
        return UserError(exc.detail)
    return RuntimeError(f"engine {exc.name} answered {exc.status}: {exc.detail}")


def cache_namespace(key: SampleKey, version: WeightVersion | None) -> str | None:
    """An inflight sampling session's own prefix-cache namespace: its adapter's weights change in place, so no
    other session may reuse what it cached (`SamplingClientKind`); None (the shared cache) for the others."""
    if version is None or version.inflight is None:
        return None
    return hashlib.sha256(key.sampler_id.encode()).hexdigest()[:32]


class EngineManager:
    def __init__(self, model_dirs: dict[str, Path], settings: EngineSettings, launcher: Launcher,
                 externals: Sequence[ExternalEngine] = ()) -> None:
        """`externals`: engines someone else started (checked: `external.check_at_startup`); they share the
        launcher's secret."""
        self.settings = settings
        self.client = InferenceClient(engines={}, secret=launcher.secret)
        self.groups = build_groups(model_dirs, settings, externals)
        for group in self.groups.values():
            for slot in group.slots.values():
                if (handle := slot.external_handle) is not None:
                    self.client.engines[slot.name] = handle.url
        self.publisher = Publisher(settings, self.client)
        self.supervisor = Supervisor(launcher, self.client, settings.control_timeout_s, self.publisher.forget,
                                     settings.probe_interval_s, settings.max_adapters)
        self.lifecycle = Lifecycle(settings, self.supervisor, self.publisher)
        self.versions = VersionStore(settings.versions_kept)
        self.in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.reference: Reference | None = None  # the trainer's forward, for the self-check (set by the server)
        self._verdicts: dict[str, asyncio.Task[Verdict]] = {}

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        external = [slot for group in self.groups.values() for slot in group.slots.values() if slot.external]
        self.supervisor.watch_external(loop, external)

    def model_dir(self, base_model: str) -> Path:
        return self.groups[base_model].model_dir

    def engine_processes(self) -> list[EngineHandle]:
        """The engines tx started (not external ones)."""
        return [s.process for g in self.groups.values() for s in g.managed() if s.process is not None]

    async def describe(self) -> list[dict[str, Any]]:
        return await describe_groups(list(self.groups.values()), self.client, self.publisher)

    # -- sampling ---------------------------------------------------------------------------
    async def sample(self, base_model: str, weights_dir: Path | None, key: SampleKey,
                     request: SampleRequest, on_tokens: TokenListener | None = None) -> SampleResult:
        """`request`'s prompt must be expanded already if it holds images (`SampleRequest.expanded`). With
        `on_tokens`, the engine streams the samples' tokens to it as they are generated; then a failed engine is
        retried only while nothing was heard yet (a retry would start the samples over)."""
        group = self.groups[base_model]
        self.in_flight += 1
        try:
            await self._checked(group)
            version = None
            if weights_dir is not None:
                version = await asyncio.to_thread(self.versions.pinned, key.sampler_id, weights_dir)
            async with self.lifecycle.use(group):
                return await self._sample_once_or_twice(group, version, key, request, on_tokens)
        finally:
            self.in_flight -= 1

    async def _checked(self, group: EngineGroup) -> None:
        """Before the group's first sample, where the engines' kind asks for it: the self-check, once
        (`selfcheck.py`); a UserError naming it when it failed. A check that could not run is tried again."""
        if not self.settings.self_check or self.reference is None or not group.managed():
            return
        task = self._verdicts.get(group.base_model)
        if task is None or (task.done() and task.exception() is not None):
            task = self._verdicts[group.base_model] = asyncio.ensure_future(self._self_check(group))
        verdict = await asyncio.shield(task)
        if verdict.refused:
            raise UserError(f"the engines cannot serve {group.base_model} exactly: {verdict.refused}; see "
                            "docs/engines.md#the-vllm-engines-self-check")

    async def _self_check(self, group: EngineGroup) -> Verdict:
        assert self.reference is not None
        prompts = check_prompts(group.model_dir)
        reference = await self.reference(group.base_model, prompts)
        if reference is None:
            logger.warning("engine self-check of %s: the trainer cannot compute the reference; not checked",
                           group.base_model)
            return Verdict()
        async with self.lifecycle.use(group):
            slot = group.managed()[0]
            await self.supervisor.ensure_running(group, slot)
            return await check_engine(self.client, slot.name, group.base_model, prompts, reference)

    async def _sample_once_or_twice(self, group: EngineGroup, version: WeightVersion | None, key: SampleKey,
                                    request: SampleRequest, on_tokens: TokenListener | None) -> SampleResult:
        self.supervisor.restart_dead_in_background(group)
        heard = False

        def hear(index: int, tokens: list[int], logprobs: list[float]) -> None:
            nonlocal heard
            heard = True
            assert on_tokens is not None
            on_tokens(index, tokens, logprobs)

        failed: set[str] = set()  # external engines that failed this request
        restarted = False
        while True:
            slot_key = group.pick(key.sampler_id, failed)  # one engine per session
            slot = group.slots[slot_key]
            process = slot.process
            try:
                await self.supervisor.ensure_running(group, slot)
                async with self.publisher.holding(slot, version) as adapter:
                    result = await self.client.sample(slot.name, str(key), request, adapter,
                                                      on_abort=lambda: self.lifecycle.resume_after_training(group),
                                                      cache_namespace=cache_namespace(key, version),
                                                      on_tokens=hear if on_tokens is not None else None)
                result.weights_version = None if version is None else version.number
                return result
            except EngineUnavailable as exc:
                logger.warning("engine %s failed during a sample: %s", slot.name, exc)
                if heard:
                    raise RuntimeError(f"engine {slot.name} failed while streaming a sample: {exc}") from exc
                if slot.external:
                    self.supervisor.mark_down(slot, str(exc))
                    failed.add(slot_key)
                    continue
                if restarted:
                    raise RuntimeError(f"engine {slot.name} failed twice while sampling: {exc}") from exc
                restarted = True
                await self.supervisor.restart(group, slot, process)
            except EngineRequestError as exc:
                raise engine_error(exc) from exc

    # -- weights ----------------------------------------------------------------------------
    def save_sampler(self, base_model: str, run_id: str, directory: Path, label: str,
                     weights: Iterable[tuple[str, Any]], *, start: bool, sampler_id: str | None = None,
                     inflight: bool = False) -> None:
        """From the training thread, after a sampler save into `directory`: the trainer's `weights` (copied now)
        become a new version, pinned to `sampler_id` if given (with `inflight`: the run's inflight target, which
        `sampler_id` follows), and published (starting the engines if `start`): an engine that holds the run's
        inflight adapter takes the new weights in place, requests generating with it included."""
        version = self.versions.add(run_id, directory, label, snapshot(weights), lora_spec(directory), inflight)
        if sampler_id is not None and inflight:
            self.versions.follow(sampler_id, run_id)
        elif sampler_id is not None:
            self.versions.pin(sampler_id, directory, label)
        try:
            self._call(self.publish(base_model, version, start=start))
        except EngineRequestError as exc:  # an engine refused the adapter (one vLLM cannot serve): say why
            raise engine_error(exc) from exc

    def prestart(self, base_model: str) -> None:
        """From any thread, when a sampler save of a run about to sample is submitted: start the group's engines
        now, without waiting, so they start while the save waits its turn and is written (its publish waits for
        them). Nothing when they run or are starting; a failure is logged, and the publish tries again."""
        group = self.groups.get(base_model)
        if group is not None and group.state is GroupState.ABSENT and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._prestart(group), self._loop)

    async def _prestart(self, group: EngineGroup) -> None:
        try:
            async with self.lifecycle.use(group):
                pass
        except Exception:  # noqa: BLE001 - the save's publish starts them again and reports why they failed
            logger.warning("engines of %s did not start ahead of a save", group.base_model, exc_info=True)

    def revoke(self, directory: Path, reason: str) -> None:
        """The checkpoint at `directory` was deleted: its weight versions go, and their clients fail with `reason`."""
        self.versions.revoke(directory, reason)

    def pin(self, sampler_id: str, directory: Path, label: str) -> None:
        """A sampling client is created from `directory` (`label` is its path): pin it to the newest version."""
        self.versions.pin(sampler_id, directory, label)

    async def publish(self, base_model: str, version: WeightVersion, *, start: bool) -> None:
        """Load a new version into every engine of the group (starting them if `start`)."""
        group = self.groups[base_model]
        if group.state is GroupState.ABSENT and not start:
            return
        async with self.lifecycle.use(group):
            slots = [s for s in group.slots.values() if s.alive or not s.external]  # down ones get it on rejoin
            await asyncio.gather(*(self._publish_to(group, s, version) for s in slots))

    async def _publish_to(self, group: EngineGroup, slot: EngineSlot, version: WeightVersion) -> None:
        try:
            if slot.external:
                await self.supervisor.ensure_running(group, slot)  # joined: leftover versions unloaded
            await self.publisher.ensure_adapter(slot, version)
        except EngineUnavailable as exc:
            if not slot.external:
                raise
            self.supervisor.mark_down(slot, str(exc))  # the others get the version; it, on rejoin

    # -- training ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def training_pass(self) -> Iterator[None]:
        """From the training thread, around a training pass: colocated engines give the device to the trainer
        (they sleep; samples wait for the pass, or are paused and resumed after it)."""
        if not self.settings.colocate:
            yield
            return
        groups = list(self.groups.values())
        try:
            for group in groups:
                self._call(self.lifecycle.take_for_training(group))
            yield
        finally:
            for group in groups:
                self._call(self.lifecycle.give_back(group))

    def _call(self, coro) -> None:
        if self._loop is None:
            raise RuntimeError("EngineManager.bind(loop) was not called")
        asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def close(self) -> None:
        await self.supervisor.close(list(self.groups.values()))
        await self.client.aclose()
