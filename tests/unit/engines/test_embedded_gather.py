"""The embedded scheduler's gather window (`batch_wait_s`): an idle engine waits it before its first batch, so a
burst is prefilled together; once its batches take rows that arrive later (continuous batching), a lone request
starts at once, and a request arriving meanwhile joins at the next step."""

from __future__ import annotations

import time
from pathlib import Path

from tx.inference.engines.embedded.scheduler import Scheduler
from tx.inference.engines.embedded.weights import Weights
from tx.inference.protocol import GenerateRequest

PROMPT = list(range(20, 36))


def test_an_idle_engine_starts_a_lone_request_at_once_once_its_batches_take_joins(tiny_model_dir: Path):
    scheduler = Scheduler(Weights(tiny_model_dir, max_adapters=1), max_batch_size=8, batch_wait_s=2.0)
    scheduler.start()
    try:
        request = GenerateRequest(prompt_token_ids=PROMPT, n=2, max_tokens=4, seed=1, stop_at_eos=False)
        start = time.perf_counter()
        first = scheduler.submit(request).result(timeout=60)
        assert time.perf_counter() - start >= 2.0  # the first batch gathered
        start = time.perf_counter()
        second = scheduler.submit(request).result(timeout=60)
        assert time.perf_counter() - start < 1.0, "a lone request waited for the gather window"
        assert second == first  # seeded: the same sample
    finally:
        scheduler.close()
