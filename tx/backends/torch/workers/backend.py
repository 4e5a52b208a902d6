"""`WorkersBackend`: the torch trainer on N worker processes (FSDP2), driven from the API process.

The API process keeps the `TrainingBackend` seam: this class checks a call the way the in-process trainer
would (so errors name the user's datum indices), splits a forward_backward's datums across the workers by
token count (contiguous shares, so outputs come back in order), and sends every worker its share over the
control channel (`messages.py`). The workers run the ordinary trainer code on their share and sum the
gradients across them (`replicated.py`, or FSDP2 in `sharded.py`). Tensors the API process needs (checkpoints, weights for the engines)
are gathered on rank 0 and come back as safetensors; checkpoints are written here in today's formats
(`checkpoint.py`), so a checkpoint saved with N workers loads with M.

Faults: a worker that dies fails the call in flight with a server error; the rest of its group is killed
(it may be blocked in a collective), the runs it held are marked lost, and the next call starts a new
group. A lost run answers a UserError that tells the user to restore from a checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tx.backends.base import adam_params
from tx.backends.datums import DatumRules
from tx.backends.lora_files import LoraFilesBackend, check_compatible
from tx.backends.losses import get_loss
from tx.backends.torch import checkpoint
from tx.backends.torch.batch import prepare_data
from tx.backends.torch.model import read_model_info
from tx.backends.torch.workers import tensors
from tx.backends.torch.workers.group import Message, WorkerDied, WorkerGroup
from tx.backends.torch.workers.messages import Reply, Request, WireAdam, WireBatch, WireCall, WireLora
from tx.backends.torch.workers.shares import combine_metrics, split_by_tokens
from tx.multimodal import AudioLimits, ImageLimits, audio_spec, vision_processor
from tx.optimizers import ADAMW, OptimizerConfig, OptimParams
from tx.types import (
    BaseLogprobs,
    BaseModelInfo,
    ConflictError,
    Datum,
    ForwardBackwardInput,
    ForwardBackwardResult,
    LoraConfig,
    NotFoundError,
    OptimStepResult,
    UserError,
)

logger = logging.getLogger(__name__)
_CPU = torch.device("cpu")
_ERRORS = {"user": UserError, "not_found": NotFoundError, "conflict": ConflictError}


@dataclass(frozen=True)
class _RunInfo:
    base_model: str
    lora: LoraConfig


class WorkersBackend(LoraFilesBackend):
    def __init__(
        self,
        models: dict[str, Path],
        start_group: Callable[[], WorkerGroup],
        *,
        image_limits: ImageLimits | None = None,
        audio_limits: AudioLimits | None = None,
        max_sequence_tokens: int | None = None,
        shares_cores: bool = False,
    ) -> None:
        """`start_group` starts a fresh, joined worker group (on the first call and after a fault);
        `image_limits` and `max_sequence_tokens` are the trainer's checks on datums (as in `TorchBackend`);
        `shares_cores`: the workers run on this machine and split the trainer's threads (`use_threads`)."""
        self._paths = {name: Path(path) for name, path in models.items()}
        self._start_group = start_group
        self._image_limits = image_limits or ImageLimits()
        self._audio_limits = audio_limits or AudioLimits()
        self._max_sequence_tokens = max_sequence_tokens
        self._infos: dict[str, BaseModelInfo] = {}
        self._group: WorkerGroup | None = None
        self._runs: dict[str, _RunInfo] = {}
        self._lost: dict[str, str] = {}  # model_id -> why
        self._lock = threading.Lock()  # one call on the group at a time
        # the last LoRA gathered (a sampler save reads it twice: files, then the engines), until weights change
        self._gathered: tuple[str, dict[str, torch.Tensor]] | None = None
        self._shares_cores = shares_cores
        self._threads: int | None = None  # the trainer's threads the current group was told (None: its spec's)

    # ---- base models ----

    def base_model_info(self, base_model: str) -> BaseModelInfo:
        if base_model not in self._paths:
            raise NotFoundError(
                f"base model {base_model!r} is not served here (served: {sorted(self._paths)})"
            )
        if base_model not in self._infos:
            self._infos[base_model] = read_model_info(base_model, self._paths[base_model])
        return self._infos[base_model]

    def served_models(self) -> list[BaseModelInfo]:
        return [self.base_model_info(name) for name in self._paths]

    def datum_rules(self, base_model: str) -> DatumRules:
        info, model_dir = self.base_model_info(base_model), self._paths[base_model]
        return DatumRules.of_model_dir(info, model_dir, self._max_sequence_tokens, self._image_limits,
                                       self._audio_limits)

    def trainer_name(self) -> str:
        return "trainer workers (--trainer-workers > 1)"

    def base_logprobs(self, base_model: str, sequences: Sequence[Sequence[int]]) -> BaseLogprobs:
        """The workers' forward of the base model (`worker.Worker._base_logprobs`), rows from rank 0."""
        self.base_model_info(base_model)
        request = Request(op="base_logprobs", base_model=base_model, sequences=[list(s) for s in sequences])
        reply, _ = self._all(request)
        return BaseLogprobs(reply.logprobs, reply.tolerance)

    # ---- runs ----

    def create_model(self, model_id: str, base_model: str, lora: LoraConfig,
                     optimizer: OptimizerConfig = ADAMW) -> None:
        if model_id in self._runs:
            raise ConflictError(f"model {model_id!r} already exists")
        lora.validate()
        self.check_optimizer(optimizer)
        self.base_model_info(base_model)
        seeded = lora if lora.seed is not None else dataclasses.replace(lora, seed=secrets.randbits(63))
        request = Request(
            op="create_model",
            model_id=model_id,
            base_model=base_model,
            lora=WireLora(**dataclasses.asdict(seeded)),
        )
        self._all(request)
        self._lost.pop(model_id, None)
        self._runs[model_id] = _RunInfo(base_model, lora)

    def has_model(self, model_id: str) -> bool:
        return model_id in self._runs

    def delete_model(self, model_id: str) -> None:
        if self._lost.pop(model_id, None) is not None:
            return
        self._run(model_id)
        self._all(Request(op="delete_model", model_id=model_id))
        del self._runs[model_id]

    def _run(self, model_id: str) -> _RunInfo:
        if model_id in self._lost:
            raise UserError(
                f"model {model_id!r} was lost: {self._lost[model_id]}. Restore it from its last checkpoint "
                "(ServiceClient.create_training_client_from_state)"
            )
        if model_id not in self._runs:
            raise NotFoundError(f"model {model_id!r} is not loaded")
        return self._runs[model_id]

    # ---- training ----

    def forward_backward(self, model_id: str, batch: ForwardBackwardInput) -> ForwardBackwardResult:
        run = self._run(model_id)
        self._check_batch(run, batch)
        shares = split_by_tokens(batch.data, self._size())
        messages = {
            rank: (Request(op="forward_backward", model_id=model_id, batch=WireBatch.of(batch, share)), b"")
            for rank, share in enumerate(shares)
        }
        replies = self._call(messages)
        return _result([replies[rank][0] for rank in sorted(replies)], [len(share) for share in shares])

    def forward_backward_many(
        self, calls: Sequence[tuple[str, ForwardBackwardInput]]
    ) -> list[ForwardBackwardResult | Exception]:
        """Every worker gets its share of each call in one message, and trains the runs it holds on one base in
        one pass (`worker.Worker._many`); a call refused by the checks here fails alone."""
        results: list[ForwardBackwardResult | Exception | None] = [None] * len(calls)
        sent: list[tuple[int, list[list[Datum]]]] = []
        for index, (model_id, batch) in enumerate(calls):
            try:
                self._check_batch(self._run(model_id), batch)
                sent.append((index, split_by_tokens(batch.data, self._size())))
            except (UserError, NotFoundError) as exc:
                results[index] = exc
        if sent:
            messages = {rank: (Request(op="forward_backward_many", calls=[
                WireCall(model_id=calls[i][0], batch=WireBatch.of(calls[i][1], shares[rank])) for i, shares in sent
            ]), b"") for rank in range(self._size())}
            replies = [reply.calls for reply, _ in (r for _, r in sorted(self._call(messages).items()))]
            for k, (index, shares) in enumerate(sent):
                results[index] = self._combine(calls[index][0], [calls_of_rank[k] for calls_of_rank in replies],
                                               [len(share) for share in shares])
        return [result for result in results if result is not None]

    def _combine(self, model_id: str, replies: list[Reply], counts: list[int]) -> ForwardBackwardResult | Exception:
        """One call's result from every rank's reply to it (in rank order), or its error."""
        return self._failure(replies, f"forward_backward of {model_id}") or _result(replies, counts)

    def _check_batch(self, run: _RunInfo, batch: ForwardBackwardInput) -> None:
        """The in-process trainer's checks, on the whole batch, before any worker starts: a rank that refused its
        share while the others ran theirs would leave the ranks' gradients apart (or, sharded, their
        collectives out of step), so only all of them refusing alike is a user error (`_call`)."""
        loss_fn = get_loss(batch.loss_fn)
        loss_fn.resolve_config(batch.loss_fn_config)
        vision = vision_processor(self._paths[run.base_model])
        info = self.base_model_info(run.base_model)
        prepare_data(batch.data, loss_fn, info, vision, self._image_limits, self._max_sequence_tokens,
                     audio_spec(self._paths[run.base_model]))

    def optim_step(self, model_id: str, params: OptimParams) -> OptimStepResult:
        adam = adam_params(params)
        adam.validate()
        self._run(model_id)
        reply, _ = self._all(
            Request(op="optim_step", model_id=model_id, adam=WireAdam(**dataclasses.asdict(adam)))
        )
        return OptimStepResult(metrics=reply.metrics)

    # ---- checkpoints ----

    def save_state(self, model_id: str, directory: Path) -> None:
        run = self._run(model_id)
        reply, payload = self._all(Request(op="read_state", model_id=model_id))
        named = tensors.from_bytes(payload)
        assert reply.optimizer_meta is not None
        optimizer = tensors.unflatten_optimizer(tensors.split_prefixed(named, "o/"), reply.optimizer_meta)
        checkpoint.write_state(
            directory, run.base_model, run.lora, tensors.split_prefixed(named, "w/"), optimizer
        )

    def load_state(self, model_id: str, directory: Path, *, with_optimizer: bool) -> None:
        run = self._run(model_id)
        base_model, lora = self.read_state_config(directory)
        check_compatible(run, base_model, lora, directory)
        named = {f"w/{k}": v for k, v in checkpoint.read_weights(directory, _CPU).items()}
        meta = None
        if with_optimizer:
            moments, meta = tensors.flatten_optimizer(checkpoint.read_optimizer_state(directory, _CPU))
            named.update({f"o/{k}": v for k, v in moments.items()})
        request = Request(op="write_state", model_id=model_id, directory=str(directory), optimizer_meta=meta)
        self._all(request, tensors.to_bytes(named))

    def iter_trainable_weights(self, model_id: str) -> Iterator[tuple[str, Any]]:
        """The run's LoRA tensors, gathered on rank 0 and copied here (CPU tensors)."""
        self._run(model_id)
        if self._gathered is None or self._gathered[0] != model_id:
            _, payload = self._all(Request(op="read_lora", model_id=model_id))
            self._gathered = model_id, tensors.from_bytes(payload)
        yield from self._gathered[1].items()

    def use_threads(self, threads: int) -> None:
        """Local workers split the trainer's threads (Ray workers keep the CPUs their placement claims)."""
        if not self._shares_cores or threads == self._threads:
            return
        self._all(Request(op="threads", threads=max(1, threads // self._size())))
        self._threads = threads

    def close(self) -> None:
        with self._lock:
            if self._group is not None:
                self._group.close()
                self._group = None

    # ---- the group ----

    def _size(self) -> int:
        return self._ensure_group().size

    def _ensure_group(self) -> WorkerGroup:
        if self._group is None:
            self._group = self._start_group()
            self._threads = None  # a new group starts with its spec's threads
        return self._group

    def _all(self, request: Request, payload: bytes = b"") -> tuple[Reply, bytes]:
        """Send `request` to every worker; rank 0's reply."""
        return self._call({rank: (request, payload) for rank in range(self._size())})[0]

    def _call(self, messages: dict[int, Message]) -> dict[int, tuple[Reply, bytes]]:
        """Every worker's reply. A worker's user error is raised as such (every rank rejects bad input the
        same way, before any collective); any other failure breaks the group."""
        with self._lock:
            group = self._ensure_group()
            op = next(iter(messages.values()))[0].op
            if op not in ("read_lora", "read_state", "forward_backward", "forward_backward_many", "threads",
                          "base_logprobs"):
                self._gathered = None  # the weights may change
            try:
                replies = group.call(messages)
            except WorkerDied as exc:
                self._lose_group(str(exc))
                raise RuntimeError(
                    f"{exc} during {op}; the trainer workers restart on the next call"
                ) from exc
        failure = self._failure([reply for reply, _ in replies.values()], op)
        if failure is not None:
            raise failure
        return replies

    def _failure(self, replies: list[Reply], what: str) -> Exception | None:
        """The error of `what` if a rank failed it. A user error every rank gave is that error (every rank
        rejects bad input the same way, before any collective); any other failure leaves the ranks apart (their
        gradients, or collectives, no longer match): the group is lost."""
        errors = [reply for reply in replies if not reply.ok]
        if not errors:
            return None
        if len(errors) == len(replies) and all(reply.error_kind in _ERRORS for reply in errors):
            return _ERRORS[errors[0].error_kind](errors[0].error)
        with self._lock:
            self._lose_group(f"a trainer worker failed in {what}: {errors[0].error}")
        return RuntimeError(f"trainer worker failed in {what}: {errors[0].error}; the trainer workers restart "
                            "on the next call")

    def _lose_group(self, why: str) -> None:
        if self._group is not None:
            self._group.close(kill=True)
            self._group = None
        for model_id in self._runs:
            self._lost[model_id] = f"its trainer workers failed ({why})"
        self._runs.clear()
        logger.error("trainer worker group lost (%s); runs lost: %s", why, sorted(self._lost))


def _result(replies: list[Reply], counts: list[int]) -> ForwardBackwardResult:
    """One forward_backward's result from every rank's reply (in rank order; `counts`: each rank's datums)."""
    outputs = [{k: v.array() for k, v in out.items()} for reply in replies for out in reply.outputs]
    return ForwardBackwardResult(loss_fn_outputs=outputs,
                                 metrics=combine_metrics([reply.metrics for reply in replies], counts))
