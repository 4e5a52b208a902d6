"""A run's sequenced training calls: forward_backward (and forward), optim_step, and load_state into the run.
Each is checked at submission (`sequencing.py`) and runs on the training thread in seq_id order."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tx.backends.base import TrainingBackend
from tx.backends.provenance import apply_records, named_sequences, needs_records
from tx.core import quotas
from tx.core.base_models import BaseModels
from tx.core.checkpoints.catalog import CheckpointCatalog
from tx.core.custom_losses import CustomLosses
from tx.core.futures import Future
from tx.core.results import WeightsLoaded
from tx.core.run_metrics import Measured, MetricsRecorder
from tx.core.sampling.records import StabilityRecords
from tx.core.scheduler import Joinable
from tx.core.sequencing import Lease, Sequencer
from tx.core.views import optimizer_of_row
from tx.optimizers import OptimParams, check_params_fit
from tx.types import (
    AudioChunk,
    ForwardBackwardInput,
    ForwardBackwardResult,
    ImageChunk,
    OptimStepResult,
    TextChunk,
    UserError,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Part:
    """One run's call in a shared pass: its run, its batch as checked at submission, and what ends it alone
    (counting, metrics) given its result and the pass's start."""

    model_id: str
    batch: Callable[[], ForwardBackwardInput]
    finish: Callable[[ForwardBackwardResult, float], ForwardBackwardResult]


class TrainingCalls:
    def __init__(self, sequencer: Sequencer, backend: TrainingBackend, custom_losses: CustomLosses,
                 catalog: CheckpointCatalog, records: StabilityRecords, training_lease: Lease | None = None,
                 recorder: MetricsRecorder | None = None, threads: Callable[[], int] | None = None,
                 base_models: BaseModels | None = None) -> None:
        """`threads`: the trainer's share of the machine's CPU threads now (`tx/cpu.py`), asked before each
        pass; None leaves the backend's threads alone. `base_models`: checks a loaded checkpoint's base weights
        (None: not checked)."""
        self.sequencer = sequencer
        self.backend = backend
        self.custom_losses = custom_losses
        self.catalog = catalog
        self.records = records
        self._training_lease = training_lease  # held around each training pass
        self.trained_tokens = 0  # target tokens of every forward_backward (not forward-only) run
        self.recorder = recorder  # per-step metrics for the console (None: not recorded)
        self.trained_by_owner: dict[str, int] = {}  # the same, per key (only the training thread writes them)
        self._threads = threads
        self.base_models = base_models
        self.shared_passes = 0  # passes that ran several runs' calls together, and the calls they ran
        self.shared_calls = 0

    def _pass(self, fn: Callable[[], T]) -> T:
        """Run `fn` (a backend call, on the training thread) with the trainer's current thread share."""
        if self._threads is not None:
            self.backend.use_threads(self._threads())
        return fn()

    def forward_backward(self, owner: str, model_id: str, seq_id: int, batch: ForwardBackwardInput) -> Future:
        run = self.sequencer.run(model_id, owner)
        if batch.loss_fn == "custom":
            batch = self.custom_losses.attach(run.session_id, batch)
        kind = "Forward" if batch.forward_only else "ForwardBackward"
        lease = None if batch.forward_only else self._training_lease
        checked = [batch]  # what `check` made of it: with the stability records it names applied

        def check() -> None:
            checked[0] = self._with_records(owner, run.session_id, run.base_model, batch)
            self.backend.check_batch(run.base_model, checked[0])
            if needs_records(batch):
                self.records.touch(owner, named_sequences(batch))  # used: each record's day starts again

        def finish(result: ForwardBackwardResult, start: float) -> ForwardBackwardResult:
            self._count(owner, batch, result)
            self._measured(model_id, "forward" if batch.forward_only else "forward_backward", start, batch, result)
            return result

        def train() -> ForwardBackwardResult:
            start = time.perf_counter()
            return finish(self._pass(lambda: self.backend.forward_backward(model_id, checked[0])), start)

        part = Part(model_id, lambda: checked[0], finish)
        joinable = Joinable(run.base_model, part, self._train_together)
        tokens, size, images = measure(batch)
        quotas.check("images_per_request", 0, images, self.sequencer.limits.images_per_request)
        check_audio_frames(batch, self.sequencer.limits.audio_frames_per_request)
        return self.sequencer.submit(owner, model_id, seq_id, kind, train, lease, check, cost=tokens, size=size,
                                     joinable=joinable, run=run)

    def _count(self, owner: str, batch: ForwardBackwardInput, result: ForwardBackwardResult) -> None:
        """Count a forward_backward's target tokens (not a forward's); only the training thread writes them."""
        if not batch.forward_only:
            tokens = sum(len(output["logprobs"]) for output in result.loss_fn_outputs)
            self.trained_tokens += tokens
            self.trained_by_owner[owner] = self.trained_by_owner.get(owner, 0) + tokens

    def _train_together(self, parts: list[Part]) -> list[ForwardBackwardResult | Exception]:
        """Several runs' forward_backward (or forward) calls in one pass (the scheduler's shared pass): each
        call's result, counted and measured as if alone, or its own error."""
        start = time.perf_counter()
        results = self._pass(lambda: self.backend.forward_backward_many([(p.model_id, p.batch()) for p in parts]))
        self.shared_passes += 1
        self.shared_calls += len(parts)
        return [r if isinstance(r, Exception) else p.finish(r, start) for p, r in zip(parts, results, strict=True)]

    def _with_records(self, owner: str, session_id: str, base_model: str,
                      batch: ForwardBackwardInput) -> ForwardBackwardInput:
        """A stable_reinforce batch with its datums checked against the records they name and their logprobs
        the recorded ones (`backends/provenance.py`); a UserError (400) naming every sequence_id it may not use."""
        if not needs_records(batch):
            return batch
        records = self.records.resolve(owner, session_id, named_sequences(batch))
        return apply_records(batch, records, base_model)

    def optim_step(self, owner: str, model_id: str, seq_id: int, params: OptimParams) -> Future:
        """A step of the run's optimizer; `params` of another optimizer are refused at submission."""
        params.validate()
        run = self.sequencer.run(model_id, owner)
        check_params_fit(optimizer_of_row(run), params)

        def step() -> OptimStepResult:
            start = time.perf_counter()
            result = self._pass(lambda: self.backend.optim_step(model_id, params))
            self._measured(model_id, "optim_step", start, None, result)
            return result

        return self.sequencer.submit(owner, model_id, seq_id, "OptimStep", step, self._training_lease, run=run)

    def _measured(self, model_id: str, kind: str, start: float, batch: ForwardBackwardInput | None,
                  result: ForwardBackwardResult | OptimStepResult) -> None:
        """Hand a finished call to the recorder (one queue put; it computes and writes on its own thread)."""
        if self.recorder is not None:
            self.recorder.record(Measured(model_id, kind, time.time(), time.perf_counter() - start, batch, result))

    def load_state(self, owner: str, model_id: str, seq_id: int, path: str, with_optimizer: bool) -> Future:
        """Legacy TrainingClient.load_state*: load a checkpoint into this existing run (with its optimizer's state
        only if it is the run's optimizer)."""
        source, source_run = self.catalog.readable(owner, path, kinds=("weights",), purpose="load")
        if self.base_models is not None:
            self.base_models.check_same_weights(source_run, str(source))
        if with_optimizer:
            saved = self.backend.read_state_optimizer(self.catalog.files.require(source))
            mine = optimizer_of_row(self.sequencer.run(model_id, owner))
            if saved != mine:
                raise UserError(f"{source} holds {saved.kind} state; this run trains with {mine.kind}")

        def run() -> WeightsLoaded:
            self.backend.load_state(model_id, self.catalog.files.require(source), with_optimizer=with_optimizer)
            return WeightsLoaded(path=str(source), model_id=model_id)

        return self.sequencer.submit(owner, model_id, seq_id, "LoadWeights", run)


def check_audio_frames(batch: ForwardBackwardInput, limit: int) -> None:
    """The audio quota bounds one datum's frames, as it bounds one sampling prompt's."""
    frames = max((sum(c.length for c in d.model_input.chunks if isinstance(c, AudioChunk)) for d in batch.data),
                 default=0)
    quotas.check("audio_frames_per_request", 0, frames, limit)


def measure(batch: ForwardBackwardInput) -> tuple[int, int, int]:
    """(tokens, bytes, images) of a batch: what fair share charges, what its queue holds, and the most images in one
    datum (the images quota bounds one sequence, as it bounds one sampling prompt; a batch's total is bounded by
    its bytes, under the queued-training-bytes quota)."""
    tokens = size = images = 0
    for datum in batch.data:
        in_datum = 0
        for chunk in datum.model_input.chunks:
            if isinstance(chunk, TextChunk):
                tokens += chunk.length
                size += 8 * chunk.length
            elif isinstance(chunk, AudioChunk):  # its frames: under the audio quota (`check_audio_frames`)
                tokens += chunk.length
                size += len(chunk.data)
            else:
                in_datum += 1
                tokens += chunk.expected_tokens or 0
                size += len(chunk.data) if isinstance(chunk, ImageChunk) else len(chunk.location)
        size += sum(int(getattr(array, "nbytes", 0)) for array in datum.loss_fn_inputs.values())
        images = max(images, in_datum)
    return tokens, size, images
