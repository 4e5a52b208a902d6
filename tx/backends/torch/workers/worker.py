"""A trainer worker: one rank of the torch.distributed group, hosting runs on base models it holds whole
(`replicated.py`, one backend shared by those runs) or sharded over the group (`sharded.py`, one per run);
`policy.py` picks per base model.

`Worker.handle` answers one control `Request` (see `messages.py`); the transports around it are a local
process speaking frames on its stdin/stdout (`main`, started by `group.LocalWorkers`) or a Ray actor
(`ray_workers.py`). Rendezvous: rank 0 opens a store on a free port of the host it is told, behind a token
("hello"; tx/inference/weight_sync/rendezvous.py, never torch's TCPStore, which listens on every interface and
answers anyone), then every rank joins the group through it ("join"). Every rank gets every request of a step, in the same order, so the ranks'
collectives line up.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tx.backends.torch.workers import tensors
from tx.backends.torch.workers.messages import (
    ErrorKind, Reply, Request, WireArray, WorkerSpec, read_frame, write_frame,
)
from tx.backends.torch.workers.policy import shard_base
from tx.backends.torch.workers.rank_backend import RankTorchBackend
from tx.backends.torch.workers.replicated import ReplicatedTorchBackend
from tx.backends.torch.workers.sharded import ShardedTorchBackend
from tx.inference.weight_sync.rendezvous import RemoteStore, StoreServer
from tx.logging import init_logging
from tx.types import ConflictError, ForwardBackwardInput, ForwardBackwardResult, NotFoundError, UserError

logger = logging.getLogger(__name__)
ERROR_KINDS: dict[type[Exception], ErrorKind] = {
    UserError: "user", NotFoundError: "not_found", ConflictError: "conflict",
}
GROUP_TIMEOUT = datetime.timedelta(minutes=30)


class Worker:
    def __init__(self, rank: int, spec: WorkerSpec, local_rank: int) -> None:
        """Rank `rank` of a group started with `spec`; `local_rank` picks its GPU among those it sees."""
        self.rank, self.world_size = rank, spec.world_size
        self.models = {name: Path(path) for name, path in spec.models.items()}
        self.device = torch.device(worker_device(spec.device, local_rank))
        self.trainer = spec.trainer
        if spec.threads:
            torch.set_num_threads(spec.threads)
        self._server: StoreServer | None = None  # rank 0: the rendezvous store it hosts
        self._store: Any = None  # the c10d store this rank joined through
        self._runs: dict[str, RankTorchBackend] = {}
        self._replicated: ReplicatedTorchBackend | None = None  # every run on a base held whole
        self._sharded: dict[str, bool] = {}  # base model -> shard it (decided once, by every rank)

    def handle(self, request: Request, payload: bytes) -> tuple[Reply, bytes]:
        try:
            return self._dispatch(request, payload)
        except Exception as exc:  # noqa: BLE001 - reported to the API process, which fails the call
            return _failure(exc, self.rank, request.op), b""

    def _dispatch(self, request: Request, payload: bytes) -> tuple[Reply, bytes]:
        op, model_id = request.op, request.model_id
        if op == "hello":
            return Reply(address=self._open_store(request.address, request.token)), b""
        if op == "join":
            self._join(request.address, request.token)
            return Reply(), b""
        if op == "threads":
            if request.threads:  # 0: only say how many
                torch.set_num_threads(request.threads)  # on the thread that runs every pass
            return Reply(metrics={"threads": torch.get_num_threads()}), b""
        if op == "create_model":
            assert request.lora is not None
            backend = self._backend_for(request.base_model)
            backend.create_model(model_id, request.base_model, request.lora.lora())
            self._runs[model_id] = backend
            return Reply(), b""
        if op == "forward_backward_many":
            return Reply(calls=self._many(request)), b""
        if op == "base_logprobs":
            return self._base_logprobs(request), b""
        backend = self._run(model_id)
        if op == "delete_model":
            if backend is self._replicated:
                backend.delete_model(model_id)
            del self._runs[model_id]
            return Reply(), b""
        if op == "forward_backward":
            assert request.batch is not None
            return _reply(backend.forward_backward(model_id, request.batch.batch())), b""
        if op == "optim_step":
            assert request.adam is not None
            return Reply(metrics=backend.optim_step(model_id, request.adam.adam()).metrics), b""
        if op == "read_lora":
            weights = backend.lora_weights(model_id)
            return Reply(), tensors.to_bytes(weights) if self.rank == 0 else b""
        if op == "read_state":
            weights = backend.lora_weights(model_id)
            moments, meta = tensors.flatten_optimizer(backend.optimizer_state(model_id))
            named = {**{f"w/{k}": v for k, v in weights.items()}, **{f"o/{k}": v for k, v in moments.items()}}
            return Reply(optimizer_meta=meta), tensors.to_bytes(named) if self.rank == 0 else b""
        if op == "write_state":
            named = tensors.from_bytes(payload)
            optimizer = None
            if request.optimizer_meta is not None:
                optimizer = tensors.unflatten_optimizer(
                    tensors.split_prefixed(named, "o/"), request.optimizer_meta
                )
            weights = tensors.split_prefixed(named, "w/")
            backend.write_weights(model_id, weights, optimizer, Path(request.directory))
            return Reply(), b""
        raise ValueError(f"unknown op {op!r}")

    def _many(self, request: Request) -> list[Reply]:
        """Each call's reply, in order: runs on bases held whole share passes (one backend for all of them);
        a sharded run runs its own, in the same order on every rank (its collectives line up)."""
        replies: list[Reply | None] = [None] * len(request.calls)
        shared: list[tuple[int, str, ForwardBackwardInput]] = []
        for index, call in enumerate(request.calls):
            backend = self._runs.get(call.model_id)
            if backend is not None and backend is self._replicated:
                shared.append((index, call.model_id, call.batch.batch()))
                continue
            try:
                replies[index] = _reply(self._run(call.model_id).forward_backward(call.model_id, call.batch.batch()))
            except Exception as exc:  # noqa: BLE001 - this call's failure, reported with it
                replies[index] = _failure(exc, self.rank, f"forward_backward of {call.model_id}")
        if shared and self._replicated is not None:
            results = self._replicated.forward_backward_many([(model_id, batch) for _, model_id, batch in shared])
            for (index, model_id, _), result in zip(shared, results, strict=True):
                replies[index] = (_failure(result, self.rank, f"forward_backward of {model_id}")
                                  if isinstance(result, Exception) else _reply(result))
        return [reply for reply in replies if reply is not None]

    def _backend_for(self, base_model: str) -> RankTorchBackend:
        """A new sharded backend for one run, or the one shared by runs on bases held whole."""
        if self._shards(base_model):
            return ShardedTorchBackend(self.models, device=str(self.device), settings=self.trainer)
        return self._whole()

    def _base_logprobs(self, request: Request) -> Reply:
        """The base model's forward of `request.sequences` (`TorchBackend.base_logprobs`), rows on rank 0: a
        base held whole runs on rank 0 alone, with the base every run on it shares; a sharded base is sharded
        afresh, with no adapter, for this call only, and every rank runs the forward (its all-gathers)."""
        if self._shards(request.base_model):
            reference = ShardedTorchBackend(self.models, device=str(self.device), settings=self.trainer)
            result = reference.sharded_base_logprobs(request.base_model, request.sequences)
        elif self.rank == 0:
            result = self._whole().base_logprobs(request.base_model, request.sequences)
        else:
            return Reply()
        return Reply(logprobs=result.logprobs, tolerance=result.tolerance) if self.rank == 0 else Reply()

    def _shards(self, base_model: str) -> bool:
        """Whether the group shards `base_model` (decided once, by every rank together)."""
        if base_model not in self.models:
            raise NotFoundError(f"base model {base_model!r} is not served here")
        if base_model not in self._sharded:
            dtype = getattr(torch, str(self.trainer.resolved(self.device.type).dtype))
            self._sharded[base_model] = shard_base(
                self.trainer.shard_base, self.models[base_model], dtype, self.device, self.world_size
            )
        return self._sharded[base_model]

    def _whole(self) -> ReplicatedTorchBackend:
        """The backend every run on a base held whole shares."""
        if self._replicated is None:
            self._replicated = ReplicatedTorchBackend(self.models, device=str(self.device), settings=self.trainer)
        return self._replicated

    def _run(self, model_id: str) -> RankTorchBackend:
        if model_id not in self._runs:
            raise NotFoundError(f"model {model_id!r} is not loaded on trainer worker {self.rank}")
        return self._runs[model_id]

    def _open_store(self, host: str, token: str) -> str:
        """Rank 0: the rendezvous store on a free port of `host`, behind `token`; its address for the others."""
        self._server = StoreServer(host, 0, token, GROUP_TIMEOUT)
        self._store = self._server.store
        return f"{host}:{self._server.port}"

    def _join(self, address: str, token: str) -> None:
        host, port = address.rsplit(":", 1)
        if self._store is None:
            self._store = RemoteStore(host.strip("[]"), int(port), token, GROUP_TIMEOUT)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend, store=self._store, rank=self.rank, world_size=self.world_size, timeout=GROUP_TIMEOUT
        )
        logger.info(
            "trainer worker %d/%d joined (%s on %s)", self.rank, self.world_size, backend, self.device
        )


def _reply(result: ForwardBackwardResult) -> Reply:
    outputs = [{k: WireArray.of(v) for k, v in out.items()} for out in result.loss_fn_outputs]
    return Reply(metrics=result.metrics, outputs=outputs)


def _failure(exc: Exception, rank: int, what: str) -> Reply:
    """The reply to a request (or one call of it) that failed: a user's mistake by its kind, anything else the
    server's (logged here, with its traceback)."""
    for error, kind in ERROR_KINDS.items():
        if isinstance(exc, error):
            return Reply(ok=False, error=str(exc), error_kind=kind)
    logger.error("worker %d: %s failed", rank, what, exc_info=exc)
    return Reply(ok=False, error=f"{type(exc).__name__}: {exc}", error_kind="server")


def worker_device(device: str, local_rank: int) -> str:
    """ "auto"/"cuda" -> this worker's GPU (cuda:local_rank) when there is one, else cpu."""
    if device in ("auto", "cuda"):
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    return device


def main(argv: list[str] | None = None) -> None:
    """A local worker process: requests on stdin, replies on the original stdout (fd 1 then goes to stderr, so
    stray prints of libraries cannot corrupt the channel)."""
    parser = argparse.ArgumentParser(description="a tx trainer worker (started by tx serve)")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--spec", required=True, help="the group's WorkerSpec as JSON")
    args = parser.parse_args(argv)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    init_logging(process=f"trainer-worker-{args.rank}")
    worker = Worker(args.rank, WorkerSpec.model_validate_json(args.spec), local_rank=args.rank)
    requests = sys.stdin.buffer
    while True:
        try:
            request, payload = read_frame(requests, Request)
        except EOFError:
            break  # the API process closed the channel (or is gone)
        reply, out = worker.handle(request, payload)
        write_frame(replies, reply, out)
    os._exit(0)  # no teardown of the group: its peers are stopping too, and nothing here needs saving


if __name__ == "__main__":
    main()
