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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tx.backends.torch.workers.group import WorkerDied
from tx.backends.torch.workers.messages import Reply, Request
from tx.inference.ray import import_ray

logger = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = 600.0


class TrainerActor:
    """One rank of the group inside a Ray actor (plain class: `RayWorkers` applies `ray.remote`)."""

    def __init__(self, rank: int, world_size: int, models: dict[str, str], device: str, threads: int) -> None:
        import torch

        from tx.backends.torch.workers.worker import Worker, worker_device

        if threads:
            torch.set_num_threads(threads)
        self.worker = Worker(rank, world_size, models, worker_device(device, 0))  # Ray shows it its GPU as 0

    def node_ip(self) -> str:
        return import_ray().util.get_node_ip_address()

    def handle(self, request_json: str, payload: bytes) -> tuple[str, bytes]:
        reply, out = self.worker.handle(Request.model_validate_json(request_json), payload)
        return reply.model_dump_json(), out


class RayWorkers:
    def __init__(
        self,
        size: int,
        models: dict[str, Path],
        device: str,
        threads: int,
        options: Callable[[int], dict[str, Any]],
    ) -> None:
        """`options(rank)`: the Ray actor options that place rank `rank` (its bundle and claims)."""
        ray = import_ray()
        self.size = size
        actor_class = ray.remote(TrainerActor)
        paths = {name: str(path) for name, path in models.items()}
        self._actors = []
        for rank in range(size):
            placed = options(rank)
            cpus = threads or max(1, int(placed.get("num_cpus") or 1))
            self._actors.append(
                actor_class.options(max_restarts=0, **placed).remote(rank, size, paths, device, cpus)
            )
        try:
            self.host = ray.get(self._actors[0].node_ip.remote(), timeout=STARTUP_TIMEOUT_S)
        except Exception as exc:
            self.close()
            raise WorkerDied(f"trainer workers did not start as Ray actors: {exc}") from exc

    def call(self, messages: dict[int, tuple[Request, bytes]]) -> dict[int, tuple[Reply, bytes]]:
        ray = import_ray()
        refs = {
            rank: self._actors[rank].handle.remote(request.model_dump_json(), payload)
            for rank, (request, payload) in messages.items()
        }
        replies: dict[int, tuple[Reply, bytes]] = {}
        pending = list(refs.values())
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            rank = next(r for r, ref in refs.items() if ref == done[0])
            try:
                text, out = ray.get(done[0])
            except ray.exceptions.RayActorError as exc:
                raise WorkerDied(f"trainer worker {rank} (a Ray actor) died: {exc}") from exc
            replies[rank] = Reply.model_validate_json(text), out
        return replies

    def close(self, *, kill: bool = False) -> None:
        ray = import_ray()
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
