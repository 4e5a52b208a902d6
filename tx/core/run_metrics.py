"""Per-step metrics of training runs, recorded for the console's curves.

The training thread hands each finished call (`forward_backward`, `forward`, `optim_step`) to the recorder with
one queue put: the batch and result it already holds, the time the call took. The recorder's own thread turns
them into rows (loss per token, tokens, trainer seconds; grad norm and learning rate; for an RL loss, its own
outputs: the importance ratio, the sampler-trainer KL, the clipped share, the advantages) and writes them in
batches, so the training thread never waits on the store.

Rows are numbered per run (`seq`) and grouped by optimizer step (`step`: the forward_backward calls of a step
and the optim_step that ends it share it). Bound: `MAX_ROWS_PER_RUN` rows per run; past it, every other row of
each kind among the run's older half is dropped (`RunMetricsTable.thin`), so a long run keeps its whole shape
at a coarser grain and its newest half at full detail.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from tx.store.metrics import RunMetricsTable
from tx.store.tables import RunMetricRow
from tx.types import ForwardBackwardInput, ForwardBackwardResult, OptimStepResult

logger = logging.getLogger(__name__)

MAX_ROWS_PER_RUN = 20_000
FLUSH_S = 0.25  # the recorder writes what it has at least this often
RL_INPUTS = ("logprobs", "advantages")


@dataclass(frozen=True)
class Measured:
    """One finished training call, as the training thread hands it over."""

    run_id: str
    kind: str  # forward_backward | forward | optim_step
    finished: float  # unix seconds
    seconds: float  # on the trainer
    batch: ForwardBackwardInput | None
    result: ForwardBackwardResult | OptimStepResult


@dataclass
class _RunCount:
    seq: int
    steps: int  # optimizer steps done
    total_tokens: int
    rows: int


class MetricsRecorder:
    def __init__(self, table: RunMetricsTable, max_rows: int = MAX_ROWS_PER_RUN, flush_s: float = FLUSH_S) -> None:
        self._table = table
        self._max_rows = max_rows
        self._flush_s = flush_s
        self._queue: queue.SimpleQueue[Measured | threading.Event | None] = queue.SimpleQueue()
        self._runs: dict[str, _RunCount] = {}
        self._thread = threading.Thread(target=self._run, name="tx-run-metrics", daemon=True)
        self._thread.start()

    def record(self, measured: Measured) -> None:
        """From the training thread: one put, nothing else."""
        self._queue.put(measured)

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until everything recorded before this call is written (tests)."""
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout_s)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch: list[Measured | threading.Event] = []
            try:
                item = self._queue.get()
                deadline = time.monotonic() + self._flush_s
                while item is not None:
                    batch.append(item)
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                stopping = True
            except queue.Empty:
                pass
            self._write(batch)

    def _write(self, batch: list[Measured | threading.Event]) -> None:
        try:
            rows = [self._row(m) for m in batch if isinstance(m, Measured)]
            if rows:
                self._table.add(rows)
                for run_id in {row.run_id for row in rows}:
                    self._bound(run_id)
        except Exception:  # noqa: BLE001 - metrics are never worth a training failure
            logger.exception("recording %d training metrics failed", len(batch))
        for waiting in batch:
            if isinstance(waiting, threading.Event):
                waiting.set()

    def _count(self, run_id: str) -> _RunCount:
        if run_id not in self._runs:
            newest = self._table.newest(run_id)
            self._runs[run_id] = (_RunCount(0, 0, 0, 0) if newest is None else
                                  _RunCount(newest.seq, newest.step, newest.total_tokens,
                                            self._table.count(run_id)))
        return self._runs[run_id]

    def _row(self, m: Measured) -> RunMetricRow:
        count = self._count(m.run_id)
        count.seq += 1
        count.rows += 1
        if isinstance(m.result, ForwardBackwardResult):
            tokens, metrics = forward_metrics(m.batch, m.result, m.seconds)
            if m.kind == "forward_backward":
                count.total_tokens += tokens
            step = count.steps + 1
        else:
            tokens, metrics = 0, finite(m.result.metrics)
            count.steps += 1
            step = count.steps
        return RunMetricRow(run_id=m.run_id, seq=count.seq, step=step, kind=m.kind, finished=m.finished,
                            seconds=m.seconds, tokens=tokens, total_tokens=count.total_tokens, metrics=metrics)

    def _bound(self, run_id: str) -> None:
        count = self._runs[run_id]
        while count.rows > self._max_rows:
            dropped = self._table.thin(run_id)
            count.rows -= dropped
            logger.debug("run %s: %d metric rows thinned to %d", run_id, dropped, count.rows)
            if not dropped:
                break


def forward_metrics(batch: ForwardBackwardInput | None, result: ForwardBackwardResult,
                    seconds: float) -> tuple[int, dict[str, float]]:
    """(target tokens, metrics) of a forward_backward or forward: loss per token (per unit of weight for
    cross_entropy, per sampled token for an RL loss), tokens/s, the loss's own metrics, and an RL loss's
    statistics."""
    tokens = sum(len(out["logprobs"]) for out in result.loss_fn_outputs)
    metrics = {k: v for k, v in result.metrics.items() if k != "loss:sum"}
    loss = float(result.metrics.get("loss:sum", math.nan))
    metrics.update(loss_sum=loss, tokens_per_s=tokens / seconds if seconds > 0 else math.nan)
    denominator = float(tokens)
    if batch is not None and batch.data:
        inputs = [d.loss_fn_inputs for d in batch.data]
        if batch.loss_fn == "cross_entropy":
            denominator = float(sum(np.sum(i["weights"]) if "weights" in i else len(i["target_tokens"])
                                    for i in inputs))
        elif all(key in i for i in inputs for key in RL_INPUTS):
            rl = rl_metrics(inputs, [out["logprobs"] for out in result.loss_fn_outputs], batch.loss_fn_config)
            denominator = rl.get("sampled_tokens", denominator)
            metrics.update(rl)
    metrics["loss_weight"] = denominator  # what loss_per_token divides by: steps add these up
    metrics["loss_per_token"] = loss / denominator if denominator > 0 else math.nan
    return tokens, finite(metrics)


def rl_metrics(inputs: list[dict[str, np.ndarray]], logprobs: list[np.ndarray],
               config: dict[str, float | str]) -> dict[str, float]:
    """An RL loss's own view of a batch, over its sampled tokens (a nonzero sampler logprob or advantage):
    the importance ratio exp(logp - q), the k1 estimate of KL(sampler || trainer), the share of ratios outside
    the clip range, and the advantages."""
    q = np.concatenate([np.asarray(i["logprobs"], np.float64).ravel() for i in inputs])
    advantages = np.concatenate([np.asarray(i["advantages"], np.float64).ravel() for i in inputs])
    logp = np.concatenate([np.asarray(lp, np.float64).ravel() for lp in logprobs])
    if not q.shape == advantages.shape == logp.shape:
        return {}
    mask = (q != 0) | (advantages != 0)
    n = int(mask.sum())
    if n == 0:
        return {"sampled_tokens": 0.0}
    log_ratio = logp[mask] - q[mask]
    ratio = np.exp(np.clip(log_ratio, -50, 50))
    low, high = float(config.get("clip_low_threshold", 0.2)), float(config.get("clip_high_threshold", 0.2))
    return {
        "sampled_tokens": float(n),
        "ratio_mean": float(ratio.mean()),
        "kl_sampler_trainer": float(-log_ratio.mean()),
        "clip_fraction": float(((ratio < 1 - low) | (ratio > 1 + high)).mean()),
        "advantage_mean": float(advantages[mask].mean()),
        "advantage_abs_mean": float(np.abs(advantages[mask]).mean()),
    }


def finite(metrics: dict[str, float]) -> dict[str, float]:
    """Only finite numbers (JSON has no NaN, PostgreSQL refuses it)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
