"""Trainer workers as Ray actors, placed in the engines' placement group (`tx serve --ray-address`).

Each actor hosts one `Worker` (the same class a local worker process runs) and answers the same control
messages: JSON text in, JSON text and safetensors bytes out. Rank 0 opens the rendezvous store on its own
node's address, so the workers may span nodes; tensors between them move over torch.distributed (NCCL on
GPUs). The launcher (`RayLauncher.trainer_options`) says where rank r goes: its own bundle, or, colocated, a
share of an engine's GPU (the engines sleep while the trainer runs a pass, as they do with one trainer).
Every node must hold the served model directories at the same paths.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, cast

from tx.backends.torch.workers.group import ERROR_GRACE_S, WorkerDied, blocked_after_error
from tx.backends.torch.workers.messages import Reply, Request, WorkerSpec
from tx.ray import import_ray

logger = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = 600.0


class TrainerActor:
    """One rank of the group inside a Ray actor (plain class: `RayWorkers` applies `ray.remote`)."""

    def __init__(self, rank: int, spec_json: str) -> None:
        from tx.backends.torch.workers.worker import Worker

        spec = WorkerSpec.model_validate_json(spec_json)
        self.worker = Worker(rank, spec, local_rank=0)  # Ray shows an actor its GPU as the only one

    def node_ip(self) -> str:
        return import_ray().util.get_node_ip_address()

    def handle(self, request_json: str, payload: bytes) -> tuple[str, bytes]:
        reply, out = self.worker.handle(Request.model_validate_json(request_json), payload)
        return reply.model_dump_json(), out


class RayWorkers:
    def __init__(self, spec: WorkerSpec, options: Callable[[int], dict[str, Any]]) -> None:
        """`options(rank)`: the Ray actor options that place rank `rank` (its bundle and claims); without
        `spec.threads`, each actor uses as many CPU threads as its placement claims CPUs."""
        ray = import_ray()
        self.size = spec.world_size
        actor_class = ray.remote(TrainerActor)
        self._actors = []
        for rank in range(self.size):
            placed = options(rank)
            threads = spec.threads or max(1, int(placed.get("num_cpus") or 1))
            mine = spec.model_copy(update={"threads": threads}).model_dump_json()
            self._actors.append(actor_class.options(max_restarts=0, **placed).remote(rank, mine))
        try:
            self.host = cast(str, ray.get(self._actors[0].node_ip.remote(), timeout=STARTUP_TIMEOUT_S))
        except Exception as exc:
            self.close()
            raise WorkerDied(f"trainer workers did not start as Ray actors: {exc}") from exc

    def call(self, messages: dict[int, tuple[Request, bytes]]) -> dict[int, tuple[Reply, bytes]]:
        ray = import_ray()
        from ray.exceptions import RayActorError
        refs = {
            rank: self._actors[rank].handle.remote(request.model_dump_json(), payload)
            for rank, (request, payload) in messages.items()
        }
        replies: dict[int, tuple[Reply, bytes]] = {}
        pending, failed_at = list(refs.values()), None
        while pending:
            timeout = None if failed_at is None else max(0.0, failed_at + ERROR_GRACE_S - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not done:
                raise blocked_after_error(replies)
            rank = next(r for r, ref in refs.items() if ref == done[0])
            try:
                text, out = ray.get(done[0])
            except RayActorError as exc:
                raise WorkerDied(f"trainer worker {rank} (a Ray actor) died: {exc}") from exc
            replies[rank] = Reply.model_validate_json(text), out
            if not replies[rank][0].ok and failed_at is None:
                failed_at = time.monotonic()
        return replies

    def close(self, *, kill: bool = False) -> None:
        ray = import_ray()
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
