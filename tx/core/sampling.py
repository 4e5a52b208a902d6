"""Sampling use cases: asample on a sampling session, through the engine manager."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from tx.core.completions import CLONE_BLOCK
from tx.core.futures import Future, FutureRegistry
from tx.inference.manager import EngineManager
from tx.multimodal import ImageInputs, expand_input
from tx.store.store import Store
from tx.types import ConflictError, ErrorCategory, NotFoundError, OverloadedError, SampleRequest, UserError

logger = logging.getLogger(__name__)


class SamplingService:
    def __init__(self, store: Store, futures: FutureRegistry, manager: EngineManager, max_queue: int,
                 images: ImageInputs | None = None) -> None:
        self.store = store
        self.futures = futures
        self.manager = manager
        self.max_queue = max_queue
        self.images = images or ImageInputs()  # default: no asset pointers, default caps
        self._tasks: dict[str, asyncio.Task] = {}

    async def sample(
        self, owner: str, sampling_session_id: str, seq_id: int, request: SampleRequest
    ) -> tuple[Future, list[str]]:
        """Submit a sample; returns its future and one sequence id per requested sample."""
        sampler = await asyncio.to_thread(self.store.get_sampling_session, sampling_session_id, owner)
        sequence_ids = [f"{sampling_session_id}:{seq_id}:{i}" for i in range(request.num_samples)]
        key = ("sample", sampling_session_id, seq_id)
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
            self._run(future, sampler.base_model, weights_dir, f"{sampling_session_id}:{seq_id}", request)
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

    async def _run(self, future: Future, base_model: str, weights_dir: Path | None, session_key: str,
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
            result = await self.manager.sample(base_model, weights_dir, session_key, request, prompt)
        except (UserError, NotFoundError, ConflictError) as exc:
            self.futures.fail(future, str(exc), ErrorCategory.USER)
        except Exception as exc:  # noqa: BLE001 - any other failure is the server's
            logger.exception("sample %s failed", future.request_id)
            self.futures.fail(future, f"{type(exc).__name__}: {exc}", ErrorCategory.SERVER)
        else:
            self.futures.resolve(future, result)
