"""Sampling use cases: asample on a sampling session, through the engine manager."""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path

from tx.core.completions import CLONE_BLOCK
from tx.core.futures import Future, FutureRegistry
from tx.inference.manager import EngineManager
from tx.multimodal import ExpandedInput, ImageInputs, expand_input
from tx.store.store import Store
from tx.types import ErrorCategory, OverloadedError, SampleKey, SampleRequest, SampleResult

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplerView:
    sampler_id: str
    base_model: str
    model_path: str | None


class SamplingService:
    def __init__(self, store: Store, futures: FutureRegistry, manager: EngineManager, max_queue: int,
                 images: ImageInputs | None = None) -> None:
        self.store = store
        self.futures = futures
        self.manager = manager
        self.max_queue = max_queue
        self.images = images or ImageInputs()  # default: no asset pointers, default caps
        self._tasks: dict[str, asyncio.Task] = {}
        self._direct_calls = itertools.count()

    def describe(self, owner: str, sampler_id: str) -> SamplerView:
        row = self.store.get_sampling_session(sampler_id, owner)
        return SamplerView(row.sampling_session_id, row.base_model, row.model_path)

    async def sample(
        self, owner: str, sampling_session_id: str, seq_id: int, request: SampleRequest
    ) -> tuple[Future, list[str]]:
        """Submit a sample; returns its future and one sequence id per requested sample."""
        sampler = await asyncio.to_thread(self.store.get_sampling_session, sampling_session_id, owner)
        call = SampleKey(sampling_session_id, seq_id)
        sequence_ids = [f"{call}:{i}" for i in range(request.num_samples)]
        key = ("sample", call)
        existing = self.futures.find(key)  # a resubmission answers with the original future
        if existing is not None:
            return existing, sequence_ids
        if self.manager.in_flight >= self.max_queue:  # refused before any future exists: a retry can succeed
            raise OverloadedError(f"{self.manager.in_flight} samples are queued; retry shortly")
        future, _ = self.futures.create(
            owner, "Sample", key, session_id=sampler.session_id, track=sampling_session_id,
            feed=(sampling_session_id, seq_id // CLONE_BLOCK),
        )
        weights_dir = Path(sampler.weights_dir) if sampler.weights_dir else None
        task = asyncio.create_task(
            self._run(future, sampler.base_model, weights_dir, call, request)
        )
        self._tasks[future.request_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(future.request_id, None))
        return future, sequence_ids

    def cancel(self, owner: str, request_id: str) -> None:
        """Cancel a future (row 23): a queued job is skipped, a running sample is aborted."""
        future = self.futures.cancel(request_id, owner)
        task = self._tasks.get(future.request_id)
        if task is not None:
            task.cancel()

    async def generate(self, base_model: str, weights_dir: Path | None, label: str,
                       request: SampleRequest) -> SampleResult:
        """A sample answered directly, without a future (the OpenAI-compatible routes): the same engines,
        router and queue limit as asample, on the newest weights saved under `weights_dir` (named `label`)."""
        if self.manager.in_flight >= self.max_queue:
            raise OverloadedError(f"{self.manager.in_flight} samples are queued; retry shortly")
        sampler_id = "oai" if weights_dir is None else f"oai:{weights_dir}"
        if weights_dir is not None:  # one pin per path, moved to its newest version at every call
            await asyncio.to_thread(self.manager.pin, sampler_id, weights_dir, label)
        return await self.manager.sample(base_model, weights_dir, SampleKey(sampler_id, next(self._direct_calls)),
                                         request)

    async def _run(self, future: Future, base_model: str, weights_dir: Path | None, call: SampleKey,
                   request: SampleRequest) -> None:
        if not self.futures.start(future):  # cancelled before it began
            return
        try:
            prompt = None
            if request.prompt.has_images:  # fetch asset pointers, check caps (blocking I/O: off the loop)
                request = await asyncio.to_thread(self.images.prepare_request, request)
                # image chunks -> the processor's placeholder tokens; a bad image fails before engines start
                prompt = await asyncio.to_thread(
                    expand_input, self.manager.model_dir(base_model), request.prompt, model_name=base_model
                )
            result = await self.manager.sample(base_model, weights_dir, call, request, prompt)
        except Exception as exc:  # noqa: BLE001 - the future carries every failure
            if self.futures.fail_with(future, exc) is ErrorCategory.SERVER:
                logger.exception("sample %s failed", future.request_id)
        else:
            self.futures.resolve(future, result)
