"""Which transport carries weights from the trainer to one engine, and at which address its group meets.

Design / who owns what:
- `choose_transport` is the whole decision: pure, typed, with the facts passed in (`TrainerFacts`, what the
  engine reports in `GET /health` plus its URL as `EngineFacts`) and the one network lookup it needs (the
  trainer's address on the route to the engine's host) injected as `route_address`.
- The table (first match wins; "same GPU" = same host and equal GPU UUIDs):

  | trainer | engine | where                        | engine takes | transport                             |
  |---------|--------|------------------------------|--------------|---------------------------------------|
  | cpu     | any    | -                            | -            | gloo                                  |
  | cuda    | cpu    | -                            | -            | gloo                                  |
  | cuda    | cuda   | a UUID unknown, same host    | -            | gloo (it may share the trainer's GPU) |
  | cuda    | cuda   | a UUID unknown, another host | nccl / not   | nccl / gloo                           |
  | cuda    | cuda   | same GPU                     | ipc          | ipc                                   |
  | cuda    | cuda   | same GPU                     | no ipc       | gloo (NCCL: one rank per GPU)         |
  | cuda    | cuda   | another GPU or another host  | nccl / not   | nccl / gloo                           |

- The group's master address (the rendezvous store the trainer hosts, rendezvous.py): 127.0.0.1 when the engine URL is loopback,
  else the trainer's own address on the route to the engine's host (a UDP `connect` picks the route and sends
  nothing). CUDA IPC needs no group, so it has no master address.
- The fact gatherers (`trainer_facts`, `local_address_towards`) are the only impure parts; the manager calls
  them, tests stub them.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeGuard
from urllib.parse import urlsplit

Transport = Literal["gloo", "nccl", "ipc"]
TRANSPORTS: tuple[Transport, ...] = ("gloo", "nccl", "ipc")
LOOPBACK = "127.0.0.1"


def is_transport(name: object) -> TypeGuard[Transport]:
    return name in TRANSPORTS


@dataclass(frozen=True)
class TrainerFacts:
    """Where the trainer runs: `device` is "cpu" or "cuda:N"; `gpu_uuid` is that GPU's UUID (cuda only)."""

    device: str
    gpu_uuid: str | None = None
    hostname: str | None = None

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")


@dataclass(frozen=True)
class EngineFacts:
    """What an engine reports about itself (its `/health`), and the URL the manager reaches it at."""

    url: str
    device: str = "cpu"
    gpu_uuid: str | None = None
    hostname: str | None = None
    transports: tuple[Transport, ...] = ("gloo",)
    transfer_ranks: int = 1  # the engine's workers in a gloo/NCCL group (tensor parallelism)

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def host(self) -> str:
        host = urlsplit(self.url).hostname
        if not host:
            raise ValueError(f"engine URL {self.url!r} has no host")
        return host

    @classmethod
    def from_health(cls, url: str, health: dict) -> EngineFacts:
        """From a `HealthResponse` as JSON; fields an engine does not report read as cpu / gloo only."""
        transports: tuple[Transport, ...] = tuple(
            t for t in health.get("weight_transports") or ("gloo",) if is_transport(t)
        )
        return cls(
            url=url,
            device=health.get("device") or "cpu",
            gpu_uuid=health.get("gpu_uuid"),
            hostname=health.get("hostname"),
            transports=transports or ("gloo",),
            transfer_ranks=int(health.get("transfer_ranks") or 1),
        )


@dataclass(frozen=True)
class TransportChoice:
    kind: Transport
    master_address: str | None  # the rendezvous store's address for gloo and nccl; None for ipc
    reason: str
    receivers: int = 1  # engine ranks in the gloo/NCCL group (the trainer is rank 0)


def choose_transport(
    trainer: TrainerFacts, engine: EngineFacts, route_address: Callable[[str], str] | None = None
) -> TransportChoice:
    """The transport for pushing weights from `trainer` to `engine` (see the table in the module docstring).

    `route_address(host)` gives the trainer's address towards a non-loopback engine host (default:
    `local_address_towards`); it is only called for gloo and nccl to an engine that is not on loopback.
    """
    kind, reason = _kind(trainer, engine)
    if kind == "ipc":
        return TransportChoice("ipc", None, reason)
    return TransportChoice(kind, master_address(engine.url, route_address), reason, engine.transfer_ranks)


def _kind(trainer: TrainerFacts, engine: EngineFacts) -> tuple[Transport, str]:
    if not trainer.on_cuda:
        return "gloo", "the trainer is on cpu"
    if not engine.on_cuda:
        return "gloo", "the engine is on cpu"
    same_host = is_loopback(engine.host) or (
        trainer.hostname is not None and trainer.hostname == engine.hostname
    )
    if trainer.gpu_uuid is None or engine.gpu_uuid is None:
        if same_host:
            return "gloo", "a GPU UUID is unknown, and on the trainer's host the engine may share its GPU"
        return _nccl_or_gloo(engine, "on another host")
    if same_host and trainer.gpu_uuid == engine.gpu_uuid:
        if "ipc" in engine.transports:
            return "ipc", "colocated: the engine shares the trainer's GPU"
        return "gloo", "the engine shares the trainer's GPU (NCCL: one rank per GPU) and takes no CUDA IPC"
    return _nccl_or_gloo(engine, "on another GPU" if same_host else "on another host")


def _nccl_or_gloo(engine: EngineFacts, where: str) -> tuple[Transport, str]:
    if "nccl" in engine.transports:
        return "nccl", f"both on CUDA, the engine {where}"
    return "gloo", f"both on CUDA, the engine {where}, but it takes no NCCL"


def master_address(url: str, route_address: Callable[[str], str] | None = None) -> str:
    """Where the trainer hosts a group's store for the engine at `url`."""
    host = EngineFacts(url=url).host
    if is_loopback(host):
        return LOOPBACK
    return (route_address or local_address_towards)(host)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def local_address_towards(host: str) -> str:
    """This machine's address on the route to `host` (UDP `connect` picks the route; nothing is sent)."""
    infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    if not infos:
        raise OSError(f"cannot resolve engine host {host!r}")
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        return sock.getsockname()[0]


def trainer_facts(device: str) -> TrainerFacts:
    """The facts of this process's training `device` ("cpu", "cuda", "cuda:N"); reads the GPU's UUID."""
    hostname = socket.gethostname()
    if not device.startswith("cuda"):
        return TrainerFacts(device=device, hostname=hostname)
    import torch

    from tx.inference.weight_sync.ipc import cuda_device_uuid

    index = torch.device(device).index
    if index is None:
        index = torch.cuda.current_device()
    return TrainerFacts(device=f"cuda:{index}", gpu_uuid=cuda_device_uuid(index), hostname=hostname)

