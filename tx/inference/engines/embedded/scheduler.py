"""The scheduler thread: gathers pending generate requests into batches, runs them, and pauses.

Design / who owns what:
- HTTP handlers `submit` a validated request and await its future; the one scheduler thread takes the oldest
  pending request, adds every other pending request for the same adapter (up to `max_batch_size` rows), and
  runs them as one padded batch with a KV cache (`generate.DecodeBatch`) until every row stopped.
- Pausing is a set of reasons (the user's pause, the engine's sleep), each with a mode. While any reason is
  set no new batch starts; `abort` ends the running batch at its next step (stop reason "abort", partial
  tokens kept); `wait` lets it finish; `keep` freezes it between two steps until the reason is removed.
- The model is only touched under `weights.lock`, one forward at a time, so weight updates land between steps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from tx.inference.engines.embedded.generate import (
    DecodeBatch,
    PromptLogprobs,
    Row,
    logits_needed,
    prompt_logprobs,
    sample_next,
)
from tx.inference.engines.embedded.vision import PromptVision
from tx.inference.engines.embedded.weights import Weights
from tx.inference.protocol import EngineStats, GenerateRequest, GenerateResponse, PauseMode

logger = logging.getLogger(__name__)


@dataclass
class Job:
    """One generate request: its `n` rows and the future its HTTP handler awaits."""

    request: GenerateRequest
    vision: PromptVision | None = None
    future: Future = field(default_factory=Future)
    rows: list[Row] = field(default_factory=list)
    prompt: PromptLogprobs | None = None

    def resolve_if_done(self) -> None:
        if self.future.done() or not all(row.done for row in self.rows):
            return
        sequences = [row.sequence() for row in self.rows]
        prompt = self.prompt
        self.future.set_result(GenerateResponse(
            sequences=sequences,
            prompt_logprobs=prompt.values if prompt and self.request.prompt_logprobs else None,
            topk_prompt_logprobs=prompt.topk if prompt else None,
        ))


class Scheduler:
    """Batches generate requests on one thread; pause, resume and stats for the HTTP layer."""

    def __init__(self, weights: Weights, max_batch_size: int, batch_wait_s: float) -> None:
        self.weights = weights
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.stats = EngineStats()
        self._cond = threading.Condition()
        self._pending: deque[Job] = deque()
        self._running: list[Job] = []
        self._reasons: dict[str, PauseMode] = {}
        self._abort_epoch = 0
        self._batch_epoch = 0  # the abort epoch the running batch started in
        self._frozen = False
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="tx-engine-scheduler", daemon=True)

    # ---- control, called from HTTP handler threads

    def start(self) -> None:
        """Run the scheduler on a thread of its own (tests, in-process use)."""
        self._thread.start()

    def run(self) -> None:
        """Run the scheduler on the calling thread until `stop`. The engine process runs it on its main
        thread: torch's OpenMP workers are much faster there than for a second Python thread (0.6 s vs 1.0 s
        for 8 x 64 tokens on 2 cores)."""
        self._loop()

    def stop(self) -> None:
        """Ask the loop to end (safe from a signal handler); a running batch ends with stop reason abort."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def close(self) -> None:
        self.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def submit(self, request: GenerateRequest, vision: PromptVision | None = None) -> Future:
        job = Job(request, vision)
        with self._cond:
            self._pending.append(job)
            self.stats.num_requests += 1
            self._cond.notify_all()
        return job.future

    def pause(self, mode: PauseMode, reason: str = "user") -> None:
        """Stop starting batches; returns once the running batch ended (abort, wait) or froze (keep)."""
        with self._cond:
            self._reasons[reason] = mode
            if mode == "abort":
                self._abort_epoch += 1
            self._cond.notify_all()
            while self._running and not (mode == "keep" and self._frozen):
                self._cond.wait()

    def resume(self, reason: str = "user") -> None:
        with self._cond:
            self._reasons.pop(reason, None)
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return "user" in self._reasons

    def counts(self) -> tuple[int, int]:
        """(running, waiting) requests."""
        with self._cond:
            return len(self._running), len(self._pending)

    # ---- the scheduler thread

    @torch.inference_mode()  # tensors made here (KV cache, masks) never leave this thread
    def _loop(self) -> None:
        while (jobs := self._next_jobs()) is not None:
            try:
                self._run(jobs)
            except Exception as exc:  # a bug or a broken model: fail these requests, keep serving
                logger.exception("batch failed")
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
            finally:
                with self._cond:
                    self._running = []
                    self._frozen = False
                    self._cond.notify_all()

    def _next_jobs(self) -> list[Job] | None:
        while True:
            with self._cond:
                while not self._stopped and (not self._pending or self._reasons):
                    self._cond.wait()
                if self._stopped:
                    return None
            self._gather()
            with self._cond:
                if self._pending and not self._reasons and not self._stopped:
                    self._running = self._take_batch()
                    self._batch_epoch = self._abort_epoch
                    return self._running

    def _gather(self, max_windows: int = 8) -> None:
        """Let concurrent requests join: wait `batch_wait_s` windows until one brings nothing new."""
        seen = -1
        for _ in range(max_windows):
            with self._cond:
                rows = sum(job.request.n for job in self._pending)
            if rows == seen or rows >= self.max_batch_size or not self.batch_wait_s:
                return
            seen = rows
            time.sleep(self.batch_wait_s)

    def _take_batch(self) -> list[Job]:
        adapter = self._pending[0].request.adapter
        jobs, rows, rest = [], 0, deque()
        while self._pending:
            job = self._pending.popleft()
            fits = not jobs or rows + job.request.n <= self.max_batch_size
            if job.request.adapter == adapter and fits:
                jobs.append(job)
                rows += job.request.n
            else:
                rest.append(job)
        self._pending = rest
        return jobs

    def _run(self, jobs: list[Job]) -> None:
        adapter = jobs[0].request.adapter
        weights = self.weights
        for job in jobs:
            job.rows = [Row.create(job.request, i, weights.eos_ids) for i in range(job.request.n)]
        rows = [row for job in jobs for row in job.rows]
        epoch = self._batch_epoch
        batch = DecodeBatch(weights.pad_id)
        with weights.lock:  # one prefill per request; its n samples share the KV cache rows
            model = weights.activate(adapter)
            prompts = [job.request.prompt_token_ids for job in jobs]
            num_kept = max(logits_needed(job.request) for job in jobs)
            kept = batch.prefill(model, prompts, num_kept, [job.vision for job in jobs])
        self._score_prompts(jobs, kept)
        expand = [j for j, job in enumerate(jobs) for _ in range(job.request.n)]
        if len(expand) != len(jobs):
            batch.select_rows(expand)
        self._record_batch(jobs, len(rows))
        self._decode(jobs, rows, batch, kept[expand, -1], adapter, epoch)

    def _decode(self, jobs, rows: list[Row], batch: DecodeBatch, logits, adapter, epoch: int) -> None:
        live = list(range(len(rows)))
        tokens: list[int] = []
        while True:
            keep = [j for j, i in enumerate(live) if not rows[i].done]
            if len(keep) < len(live):
                for job in jobs:
                    job.resolve_if_done()
                if not keep:
                    return
                batch.select_rows(keep)
                live, logits = [live[j] for j in keep], logits[keep]
            if tokens:  # not the first iteration: feed the tokens of the rows still live
                if not self._checkpoint(epoch, adapter):
                    return self._abort(jobs)
                with self.weights.lock:
                    model = self.weights.activate(adapter)
                    logits = batch.step(model, [rows[i].token_ids[-1] for i in live])
            tokens, logprobs = sample_next(logits, [rows[i] for i in live])
            for i, token, logprob in zip(live, tokens, logprobs):
                rows[i].append(token, logprob, self.weights.decode)
            self._record_step(len(live))

    def _checkpoint(self, epoch: int, adapter: str | None) -> bool:
        """Between two steps: False to abort; blocks while a `keep` pause holds the batch."""
        with self._cond:
            while True:
                if self._abort_epoch != epoch or self._stopped:
                    return False
                if "keep" not in self._reasons.values():
                    self._frozen = False
                    return adapter is None or self.weights.has_adapter(adapter)
                if not self._frozen:
                    self._frozen = True
                    self._cond.notify_all()
                self._cond.wait()

    def _abort(self, jobs: list[Job]) -> None:
        for job in jobs:
            for row in job.rows:
                if not row.done:
                    row.stop_reason = "abort"
            job.resolve_if_done()

    def _score_prompts(self, jobs: list[Job], kept) -> None:
        for job, logits in zip(jobs, kept):
            request = job.request
            if request.prompt_logprobs or request.topk_prompt_logprobs:
                job.prompt = prompt_logprobs(
                    logits, request.prompt_token_ids, request.prompt_logprobs_last_n,
                    request.topk_prompt_logprobs,
                )

    def _record_batch(self, jobs: list[Job], num_rows: int) -> None:
        stats = self.stats
        stats.num_batches += 1
        stats.max_requests_per_batch = max(stats.max_requests_per_batch, len(jobs))
        stats.max_rows_per_step = max(stats.max_rows_per_step, num_rows)

    def _record_step(self, num_rows: int) -> None:
        self.stats.num_decode_steps += 1
        self.stats.num_generated_tokens += num_rows
