"""The running batch: the rows being decoded together, which requests join between two decode steps and rows
leave as they finish.

Design / who owns what:
- `Job` is one generate request: its `n` rows, the future its HTTP handler awaits, and an optional listener
  that hears every token as it is sampled (the streaming route).
- `RunningBatch` owns the rows in their KV cache order and the `DecodeBatch` that holds the cache. `admit`
  prefills new requests on their own (left-padded, one prefill per request, its `n` samples sharing the prompt's
  cache rows), samples their first tokens, and appends their rows to the running cache (`DecodeBatch.merge`);
  `step` feeds every live row its last token and samples the next; rows that stopped leave after each of them.
- Rows of different adapters share a forward when the weights are `mixable` (`Weights.use`, `mixing.py`).
- A failure answers every request it touched with the error, and no other: a prefill (or its prompt scores, or its
  first tokens) that raises fails the requests being admitted and leaves the running rows be; a listener that
  raises fails its own request; anything else (a decode step, a cache reorder, the merge) fails the whole batch
  (`fail`, called by the scheduler with the requests it was admitting). docs/engines.md#the-embedded-engine.
- Only the scheduler thread calls these; the model is touched under `weights.lock`, one forward at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import torch

from tx.inference.engines.embedded.generate import (
    DecodeBatch,
    PromptLogprobs,
    Row,
    alternative_tokens,
    logits_needed,
    prompt_logprobs,
    sample_next,
    target_logprobs,
)
from tx.inference.engines.embedded.vision import PromptVision
from tx.inference.engines.embedded.weights import Weights
from tx.inference.protocol import EngineStats, GenerateRequest, GenerateResponse

logger = logging.getLogger(__name__)

Listener = Callable[[int, int, float], None]  # (sample index, token, raw logprob), on the scheduler thread


def settle(future: Future, outcome: GenerateResponse | BaseException) -> None:
    """Answer `future` unless it is done: its caller may cancel it from another thread at any moment."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:  # cancelled (or answered) meanwhile
        pass


@dataclass(eq=False)
class Job:
    """One generate request: its `n` rows and the future its HTTP handler awaits."""

    request: GenerateRequest
    vision: PromptVision | None = None
    listener: Listener | None = None
    future: Future = field(default_factory=Future)
    rows: list[Row] = field(default_factory=list)
    prompt: PromptLogprobs | None = None
    target: list[list[float]] | None = None  # target_token_ids' logprobs
    alternatives: tuple[list[list[int]], list[list[float]]] | None = None  # prompt_alt_tokens_k's draws

    def resolve_if_done(self) -> bool:
        """Set the future once every row stopped; whether the job is over."""
        if self.future.done():
            return True
        if not all(row.done for row in self.rows):
            return False
        prompt, alternatives = self.prompt, self.alternatives
        settle(self.future, GenerateResponse(
            sequences=[row.sequence() for row in self.rows],
            prompt_logprobs=prompt.values if prompt and self.request.prompt_logprobs else None,
            topk_prompt_logprobs=prompt.topk if prompt else None,
            target_prompt_logprobs=self.target,
            prompt_alt_tokens=alternatives[0] if alternatives else None,
            prompt_alt_logprobs=alternatives[1] if alternatives else None,
        ))
        return True


class RunningBatch:
    """The rows decoding together (in cache order) and the jobs they belong to."""

    def __init__(self, weights: Weights, stats: EngineStats) -> None:
        self.weights = weights
        self.stats = stats
        self.decode: DecodeBatch | None = None
        self.rows: list[Row] = []
        self.owners: list[Job] = []  # the job of each row
        self.jobs: list[Job] = []  # jobs with rows still running
        self.takes_joins = False  # whether the last prefilled batch's cache could take rows (`DecodeBatch.joinable`)

    @property
    def adapters(self) -> list[str | None]:
        return [row.request.adapter for row in self.rows]

    def accepts(self, job: Job) -> bool:
        """Whether `job`'s rows may join the rows running now: the cache takes new rows and `job` has no images
        (an idle batch accepts any). Which adapters share a batch is the scheduler's choice."""
        if not self.rows:
            return True
        assert self.decode is not None
        return job.vision is None and self.decode.joinable and self.weights.serving.joins

    def admit(self, jobs: list[Job]) -> None:
        """Prefill `jobs` together, sample their first tokens and append their rows to the running batch. A failure
        before their rows join answers `jobs` with it (the running rows go on); one while joining raises."""
        try:
            batch, owners = self._prefill(jobs)
        except Exception as exc:  # a broken model or request: these jobs fail, the running batch is untouched
            logger.exception("prefill of %d requests failed", len(jobs))
            for job in jobs:
                settle(job.future, exc)
            return
        self._join(jobs, batch, owners)

    def _prefill(self, jobs: list[Job]) -> tuple[DecodeBatch, list[Job]]:
        """`jobs`' rows prefilled on their own cache, their prompt scores and first tokens; (their batch, each new
        row's job). Touches nothing of the running batch."""
        weights = self.weights
        for job in jobs:
            job.rows = [Row.create(job.request, i, weights.eos_ids) for i in range(job.request.n)]
        expand = [j for j, job in enumerate(jobs) for _ in range(job.request.n)]
        # a job's rows share its prompt's prefill (cache rows copied), unless the engine's self-check found
        # copying rows wrong for the model (`ServingPlan.reorder`): then each row is prefilled from the prompt
        prefilled = list(range(len(jobs))) if weights.serving.reorder else expand  # the job of each prefill row
        batch = DecodeBatch(weights.pad_id)
        with weights.lock:
            model = weights.use([jobs[j].request.adapter for j in prefilled])
            num_kept = max(logits_needed(job.request) for job in jobs)
            kept = batch.prefill(model, [jobs[j].request.prompt_token_ids for j in prefilled], num_kept,
                                 [jobs[j].vision for j in prefilled])
        _score_prompts(jobs, kept[[prefilled.index(j) for j in range(len(jobs))]])
        if len(prefilled) != len(expand):
            batch.select_rows(expand)
            kept = kept[expand]
        owners = [job for job in jobs for _ in job.rows]
        self._sample(kept[:, -1], [row for job in jobs for row in job.rows], owners)
        return batch, owners

    def _join(self, jobs: list[Job], batch: DecodeBatch, owners: list[Job]) -> None:
        """Append the prefilled `batch` of `jobs` to the running rows."""
        self.takes_joins = batch.joinable and self.weights.serving.joins
        if self.decode is None:
            self.decode = batch
        else:
            self.decode.merge(batch)
            self.stats.num_joins += len(jobs)
        self.rows += [row for job in jobs for row in job.rows]
        self.owners += owners
        self.jobs += jobs
        self.stats.num_batches += 1
        self._record_shape()
        self.drop_finished()

    def step(self) -> None:
        """One decode step for every live row (each has one sampled token the cache has not seen)."""
        with self.weights.lock:
            self.abort(only_adapters_gone=True)  # unloaded since the scheduler looked (a failed load, a delete)
            if not self.rows:
                return
            assert self.decode is not None
            live = next(row for row in self.rows if not row.done)  # rows that stopped may stay (`drop_finished`)
            tokens = [row.token_ids[-1] if row.token_ids else self.weights.pad_id for row in self.rows]
            adapters = [(live if row.done else row).request.adapter for row in self.rows]
            model = self.weights.use(adapters)
            lean = self.weights.lean_plan(model) if len(set(adapters)) == 1 else None
            logits = self.decode.step(model, tokens, lean)
        self._sample(logits, self.rows, self.owners)
        self.stats.num_decode_steps += 1
        self._record_shape()
        self.drop_finished()

    def _sample(self, logits: torch.Tensor, rows: list[Row], owners: list[Job]) -> None:
        live = [i for i, row in enumerate(rows) if not row.done]
        if not live:
            return
        never = self.weights.never_sampled  # a vision-language model's placeholders (generate.py)
        if len(live) < len(rows):  # rows that stopped stay in the batch (`drop_finished`): their logits go
            logits, rows, owners = logits[live], [rows[i] for i in live], [owners[i] for i in live]
        tokens, logprobs, topk = sample_next(logits, rows, never)
        for row, owner, token, logprob, best in zip(rows, owners, tokens, logprobs, topk):
            row.append(token, logprob, self.weights.decode, best)
            self._tell(owner, row.sample_index, token, logprob)
        self.stats.num_generated_tokens += len(rows)

    def _tell(self, job: Job, index: int, token: int, logprob: float) -> None:
        """Hand a sampled token to `job`'s listener; one that raises fails its own job only (its rows leave)."""
        if job.listener is None or job.future.done():
            return
        try:
            job.listener(index, token, logprob)
        except Exception as exc:
            logger.exception("a token listener failed")
            settle(job.future, exc)
            for row in job.rows:
                row.stop_reason = row.stop_reason or "abort"

    def drop_finished(self) -> None:
        """Rows that stopped leave the batch; the jobs all of whose rows stopped are answered. Where the engine's
        self-check found re-indexing the cache wrong for the model (`ServingPlan.reorder`), stopped rows stay
        (stepped, never sampled) until every row has stopped."""
        keep = [i for i, row in enumerate(self.rows) if not row.done]
        self.jobs = [job for job in self.jobs if not job.resolve_if_done()]
        if len(keep) == len(self.rows) or keep and not self.weights.serving.reorder:
            return
        self.rows = [self.rows[i] for i in keep]
        self.owners = [self.owners[i] for i in keep]
        if not keep:
            self.decode = None
        else:
            assert self.decode is not None
            self.decode.select_rows(keep)

    def abort(self, only_adapters_gone: bool = False) -> None:
        """End rows now with stop reason abort (tokens so far kept): all, or those whose adapter was unloaded."""
        for row in self.rows:
            adapter = row.request.adapter
            if not only_adapters_gone or (adapter is not None and not self.weights.has_adapter(adapter)):
                row.stop_reason = "abort"
        self.drop_finished()

    def drop_cancelled(self) -> int:
        """Rows whose caller went away (their job's future was cancelled) leave now; how many jobs left."""
        gone = {id(job) for job in self.owners if job.future.cancelled()}
        if not gone:
            return 0
        for row, job in zip(self.rows, self.owners):
            if id(job) in gone:
                row.stop_reason = "abort"
        self.drop_finished()
        return len(gone)

    def fail(self, exc: BaseException, admitting: list[Job] | None = None) -> None:
        """A step failed (a bug or a broken model): fail every job of the batch, and the `admitting` ones not in it
        yet, with `exc`, and start empty."""
        for job in self.jobs + (admitting or []):
            settle(job.future, exc)
        self.decode, self.rows, self.owners, self.jobs = None, [], [], []

    def _record_shape(self) -> None:
        stats = self.stats
        stats.max_requests_per_batch = max(stats.max_requests_per_batch, len(self.jobs))
        stats.max_rows_per_step = max(stats.max_rows_per_step, len(self.rows))
        stats.max_adapters_per_step = max(stats.max_adapters_per_step, len(set(self.adapters)))


def _score_prompts(jobs: list[Job], kept: torch.Tensor) -> None:
    for job, logits in zip(jobs, kept):
        request = job.request
        if request.prompt_logprobs or request.topk_prompt_logprobs:
            job.prompt = prompt_logprobs(
                logits, request.prompt_token_ids, request.prompt_logprobs_last_n, request.topk_prompt_logprobs,
            )
        if request.target_token_ids is not None:
            job.target = target_logprobs(logits, request)
        if request.prompt_alt_tokens_k:
            job.alternatives = alternative_tokens(logits, request)
