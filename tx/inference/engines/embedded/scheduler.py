"""The scheduler thread: continuous batching. Requests join the running batch between two decode steps, rows
leave as they finish, and rows of different adapters share a batch (`batch.py` holds the batch itself).

Design / who owns what:
- HTTP handlers `submit` a validated request and await its future. The one scheduler thread loops: between two
  decode steps it admits the pending requests that fit (FIFO, up to `max_batch_size` rows, whatever their
  adapter when the weights mix adapters, else those of the running rows' adapter), prefills them and appends
  their rows to the running batch, then runs one decode step for every live row. An idle engine whose last batch
  could take new rows starts a request at once (those arriving meanwhile join at the next step); otherwise (a
  static batch, or no batch yet) it first waits `batch_wait_s` windows while requests keep arriving, so a burst
  is prefilled together.
- A batch whose cache cannot take new rows (a sliding window, linear attention, image rope offsets: see
  `DecodeBatch.joinable`), or whose model failed the engine's join self-check (`selfcheck.py`), runs as a static
  batch: requests wait until it ends. A model that failed the padded self-check gets one request per batch.
- Pausing is a set of reasons (the user's pause, the engine's sleep), each with a mode. While any reason is
  set nothing is admitted; `abort` ends the running rows at the next step boundary (stop reason "abort",
  partial tokens kept); `wait` lets them finish; `keep` freezes them between two steps until the reason is
  removed. A row whose adapter was unloaded meanwhile ends with "abort" too.
- A caller that goes away cancels its job's future (`Future.cancel`, from any thread; the engine app does it when
  the HTTP client disconnects): a pending job is never admitted, a running job's rows leave the batch before the
  next step (stats: `num_cancelled`).
- The model is only touched under `weights.lock`, one forward at a time, so weight updates land between steps.
- No request is left waiting: a step that raises (admission, prefill, decode, row selection, an abort, a
  listener) answers every request it touched with the error, and the loop goes on (`_turn`; which requests a
  failure touches: `batch.py`). Requests still pending when the scheduler stops are answered with an error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future

import torch

from tx.inference.engines.embedded.batch import Job, Listener, RunningBatch, settle
from tx.inference.engines.embedded.vision import PromptVision
from tx.inference.engines.embedded.weights import Weights
from tx.inference.protocol import EngineStats, GenerateRequest, PauseMode

logger = logging.getLogger(__name__)


class Scheduler:
    """Batches generate requests continuously on one thread; pause, resume and stats for the HTTP layer."""

    def __init__(self, weights: Weights, max_batch_size: int, batch_wait_s: float, static: bool = False) -> None:
        """`static`: one adapter per batch, and no request joins a batch that runs (for comparison)."""
        self.weights = weights
        self.static = static
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.stats = EngineStats()
        self._cond = threading.Condition()
        self._pending: deque[Job] = deque()
        self._batch = RunningBatch(weights, self.stats)
        self._running = 0  # jobs in the batch, for `counts` and `pause` (read under `_cond`)
        self._reasons: dict[str, PauseMode] = {}
        self._abort_epoch = 0
        self._seen_epoch = 0  # the abort epoch the running rows were checked against
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

    def submit(self, request: GenerateRequest, vision: PromptVision | None = None,
               listener: Listener | None = None) -> Future:
        """Queue `request`; `listener` (if any) hears each token as it is sampled, on the scheduler thread."""
        job = Job(request, vision, listener)
        with self._cond:
            self._pending.append(job)
            self.stats.num_requests += 1
            self._cond.notify_all()
        return job.future

    def pause(self, mode: PauseMode, reason: str = "user") -> None:
        """Stop admitting requests; returns once the running rows ended (abort, wait) or froze (keep)."""
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
            return self._running, len(self._pending)

    # ---- the scheduler thread

    @torch.inference_mode()  # tensors made here (KV cache, masks) never leave this thread
    def _loop(self) -> None:
        while self._turn():
            self._publish_running()
        self._end()

    def _turn(self) -> bool:
        """One turn between two decode steps: wait for work, admit, step. False once stopped. A step that raises
        (a bug or a broken model) fails every job it touched, those being admitted included, and the loop goes
        on: no request is left waiting, and the engine keeps serving."""
        batch, jobs = self._batch, []
        try:
            if not self._wait_for_work():
                return False
            if not batch.rows and not self._starts_at_once():
                self._gather()
            self.stats.num_cancelled += batch.drop_cancelled()
            jobs = self._take_jobs()
            if jobs:
                batch.admit(jobs)
            if batch.rows:
                batch.step()
        except Exception as exc:
            logger.exception("batch failed")
            batch.fail(exc, jobs)
        return True

    def _end(self) -> None:
        """Stopped: the running rows end with stop reason abort, and the requests still pending are answered."""
        try:
            self._batch.abort()
        except Exception as exc:
            logger.exception("aborting the batch failed")
            self._batch.fail(exc)
        with self._cond:
            pending, self._pending = list(self._pending), deque()
        for job in pending:
            settle(job.future, RuntimeError("the engine stopped before this request was admitted"))
        self._publish_running()

    def _publish_running(self) -> None:
        with self._cond:
            self._running = len(self._batch.jobs)
            if not self._running:
                self._frozen = False
            self._cond.notify_all()

    def _wait_for_work(self) -> bool:
        """Between two steps: True to go on (rows to step or requests to admit), False once stopped. Aborts the
        running rows when asked; blocks while idle, or while a `keep` pause holds the rows."""
        batch = self._batch
        while True:
            with self._cond:
                if self._stopped:
                    return False
                aborted = self._abort_epoch != self._seen_epoch
                self._seen_epoch = self._abort_epoch
                if not aborted and batch.rows:
                    if "keep" not in self._reasons.values():
                        self._frozen = False
                        break
                    if not self._frozen:
                        self._frozen = True
                        self._cond.notify_all()
                    self._cond.wait()
                    continue
                if not aborted:
                    if self._pending and not self._reasons:
                        return True
                    self._cond.wait()
                    continue
            batch.abort()  # outside the lock: it answers futures
            self._publish_running()
        batch.abort(only_adapters_gone=True)
        if not batch.rows:
            self._publish_running()
        return True

    def _starts_at_once(self) -> bool:
        """Whether an idle engine admits now: its batches take rows that arrive later (the last one could) and the
        first pending request has no images (a batch with images cannot)."""
        if self.static or not self._batch.takes_joins:
            return False
        with self._cond:
            return not self._pending or self._pending[0].vision is None

    def _gather(self, max_windows: int = 8) -> None:
        """Let concurrent requests arrive together: wait `batch_wait_s` windows until one brings nothing new."""
        seen = -1
        for _ in range(max_windows):
            with self._cond:
                rows = sum(job.request.n for job in self._pending)
            if rows == seen or rows >= self.max_batch_size or not self.batch_wait_s:
                return
            seen = rows
            time.sleep(self.batch_wait_s)

    def _take_jobs(self) -> list[Job]:
        """The pending requests that join now, oldest first, as many rows as fit; none while paused."""
        batch = self._batch
        with self._cond:
            single = not self.weights.serving.padded  # a batch holds one request: its rows have one length
            if self._reasons or not self._pending or ((self.static or single) and batch.rows):
                return []
            free = self.max_batch_size - len(batch.rows)
            adapter = (batch.rows[0] if batch.rows else self._pending[0]).request.adapter
            mixable = self.weights.mixable and not self.static
            taken: list[Job] = []
            rest: deque[Job] = deque()
            for job in self._pending:
                if job.future.cancelled():
                    self.stats.num_cancelled += 1
                    continue
                fits = job.request.n <= free or not (taken or batch.rows)  # one request may exceed the size
                fits = fits and not (single and taken)
                if fits and (mixable or job.request.adapter == adapter) and batch.accepts(job):
                    taken.append(job)
                    free -= job.request.n
                else:
                    rest.append(job)
            self._pending = rest
            self._running = len(batch.jobs) + len(taken)
            return taken
