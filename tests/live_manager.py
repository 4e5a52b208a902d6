"""A real EngineManager on its own event loop thread, as the server runs it, for tests that drive the manager's
entry points (the training thread's `training_pass`, samples from request handlers) without an API server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from typing import Any

from tx.inference.manager import EngineManager
from tx.types import ModelInput, SampleKey, SampleRequest, SampleResult, SamplingParams


class LiveManager:
    def __init__(self, manager: EngineManager, model: str) -> None:
        self.manager, self.model = manager, model
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        manager.bind(self.loop)

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout_s: float = 300.0) -> Any:
        return self.submit(coro).result(timeout_s)

    def sample_later(self, sampler: str, seq: int = 0, tokens: list[int] | None = None,
                     params: SamplingParams | None = None, weights_dir: Path | None = None,
                     ) -> concurrent.futures.Future:
        """A sample by sampling client `sampler` (on the adapter in `weights_dir`, or the base model)."""
        request = SampleRequest(ModelInput.from_tokens(tokens or [5, 17, 230]), num_samples=1,
                                params=params or SamplingParams(max_tokens=4, temperature=0.0))
        return self.submit(self.manager.sample(self.model, weights_dir, SampleKey(sampler, seq), request))

    def sample(self, sampler: str, seq: int = 0, **kwargs: Any) -> SampleResult:
        return self.sample_later(sampler, seq, **kwargs).result(300)

    def engines(self) -> dict[str, dict]:
        (group,) = self.run(self.manager.describe())
        return {e["name"]: e for e in group["engines"]}

    def state(self) -> str:
        return self.manager.groups[self.model].state.value

    def close(self) -> None:
        self.run(self.manager.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
