"""Weight versions: a counter, a new number at every sampler save (also when a name is saved again).

Design / who owns what:
- A version holds the trainer's LoRA tensors as they were at the save (cpu copies, taken on the training
  thread), the LoRA shape, and the path users know it by (for error messages). Engines load a version by its
  adapter name `v<number>`; a directory saved again gets a new number, so it is pushed again.
- Every sampling client is pinned, when it is created, to the newest version of the path it names. It keeps
  those weights while they are held; a run holds its `keep` newest versions. A client whose version was
  dropped gets a clear error naming its path.
- A path with no version held (its save predates this server process) is read from its directory once, when
  a client is pinned to it, and becomes a version like any other.
- An inflight save (`SamplingClientKind` "inflight") makes its version the run's inflight target. Every
  inflight version of a run is served by one adapter name (`inflight<k>`), so engines take each new one in
  place, requests generating with it included; inflight clients follow the target (the weights current when
  they were created, or newer), and the target is held whatever `keep` says. The target lives in memory: after a
  restart an inflight client is pinned to the weights it was created with, as a snapshot client is.
- A deleted checkpoint's versions are dropped at once (`revoke`): clients pinned to them get an error naming
  why, never its weights.
- Thread-safe: saves come from the training thread, pins from request threads, lookups from the event loop.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from tx.inference.protocol import LoraSpec
from tx.types import NotFoundError, UserError

MAX_REVOKED = 4096  # deleted versions whose clients are told why
NamedTensors = list[tuple[str, Any]]  # (PEFT file name, cpu tensor), sorted by name


@dataclass(frozen=True)
class WeightVersion:
    number: int
    owner: str  # the run the version belongs to (its `keep` newest versions are held)
    directory: Path  # where the save was written (checkpoints; vLLM loads adapters from files)
    label: str  # the path users know it by
    named: NamedTensors
    spec: LoraSpec
    inflight: str | None = None  # its run's inflight adapter, for an inflight save

    @property
    def adapter(self) -> str:
        """The engines' adapter name: `v<number>`, or the run's inflight adapter (each new version replaces the
        one it holds)."""
        return self.inflight or f"v{self.number}"


def snapshot(weights: Iterable[tuple[str, Any]]) -> NamedTensors:
    """The trainer's tensors as cpu copies (training goes on changing its own), sorted by name."""
    return sorted((name, _cpu_copy(tensor)) for name, tensor in weights)


def _cpu_copy(tensor: Any) -> torch.Tensor:
    if isinstance(tensor, torch.Tensor):
        return tensor.detach().to("cpu", copy=True)
    return torch.from_numpy(np.array(tensor))  # another framework's array (np.array copies)


def lora_spec(directory: Path) -> LoraSpec:
    """The LoRA shape written next to the weights (adapter_config.json)."""
    config = json.loads((directory / "adapter_config.json").read_text())
    return LoraSpec(
        r=config["r"], lora_alpha=config["lora_alpha"], target_modules=sorted(config["target_modules"]),
        target_parameters=sorted(config.get("target_parameters") or []),
        exclude_modules=sorted(config.get("exclude_modules") or []),
    )


def read_adapter(directory: Path) -> NamedTensors:
    """The tensors of a PEFT adapter directory, sorted by name."""
    if not (directory / "adapter_model.safetensors").is_file():
        raise UserError(f"no sampler weights at {directory.name!r}: they were deleted; save new ones")
    return sorted(safetensors.torch.load_file(str(directory / "adapter_model.safetensors")).items())


class VersionStore:
    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._versions: OrderedDict[int, WeightVersion] = OrderedDict()  # held, oldest first
        self._latest: dict[Path, int] = {}  # directory -> its newest version
        self._pins: dict[str, tuple[int, str]] = {}  # sampler id -> (version, label)
        self._inflight: dict[str, int] = {}  # run -> its inflight target (a version number)
        self._inflight_names: dict[str, str] = {}  # run -> the adapter name its inflight versions share
        self._followers: dict[str, str] = {}  # inflight sampler id -> its run
        self._revoked: dict[int, str] = {}  # version number -> why its clients may not sample it
        self._counter = 0
        self._lock = threading.Lock()

    def add(self, owner: str, directory: Path, label: str, named: NamedTensors, spec: LoraSpec,
            inflight: bool = False) -> WeightVersion:
        """A new version (the next number) of `directory`, and with `inflight` the owner's inflight target; drops
        the owner's versions beyond `keep` (never its inflight target)."""
        with self._lock:
            self._counter += 1
            name = None
            if inflight:
                name = self._inflight_names.setdefault(owner, f"inflight{len(self._inflight_names) + 1}")
            version = WeightVersion(self._counter, owner, directory.resolve(), label, named, spec, name)
            self._versions[version.number] = version
            self._latest[version.directory] = version.number
            if inflight:
                self._inflight[owner] = version.number
            mine = [n for n, v in self._versions.items() if v.owner == owner and n != self._inflight.get(owner)]
            for number in mine[: max(0, len(mine) - self.keep)]:
                del self._versions[number]
            return version

    def follow(self, sampler_id: str, owner: str) -> None:
        """An inflight sampling client of run `owner`: it samples its run's inflight target, whichever that is."""
        with self._lock:
            self._followers[sampler_id] = owner

    def latest(self, directory: Path) -> WeightVersion | None:
        with self._lock:
            number = self._latest.get(directory.resolve())
            return None if number is None else self._versions.get(number)

    def pin(self, sampler_id: str, directory: Path, label: str) -> WeightVersion:
        """Pin a sampling client to the newest version of `directory` (read from it if none is held)."""
        version = self.latest(directory)
        if version is None:
            version = self.add(str(directory.resolve()), directory, label, read_adapter(directory),
                               lora_spec(directory))
        with self._lock:
            self._pins[sampler_id] = (version.number, label)
        return version

    def pinned(self, sampler_id: str, directory: Path) -> WeightVersion:
        """The version a sampling client was pinned to (pinned now if it never was: a client from before a
        restart of this server); an inflight client's run's inflight target."""
        with self._lock:
            run = self._followers.get(sampler_id)
            if run is not None:
                return self._versions[self._inflight[run]]
            pin = self._pins.get(sampler_id)
            version = None if pin is None else self._versions.get(pin[0])
        if pin is None:
            return self.pin(sampler_id, directory, directory.name)
        if version is None:
            number, label = pin
            if number in self._revoked:
                raise NotFoundError(self._revoked[number])
            raise UserError(
                f"the weights this sampling client was created from ({label}, version {number}) are no longer "
                f"held on the server: newer weights were saved since; create a new sampling client from {label}"
            )
        return version

    def revoke(self, directory: Path, reason: str) -> int:
        """Drop every version saved at `directory` (its checkpoint was deleted); their clients get `reason`."""
        directory = directory.resolve()
        with self._lock:
            targets = set(self._inflight.values())  # unnamed saves: no checkpoint to delete them by
            dropped = [n for n, v in self._versions.items() if v.directory == directory and n not in targets]
            for number in dropped:
                del self._versions[number]
                self._revoked[number] = reason
            while len(self._revoked) > MAX_REVOKED:  # the oldest reasons go; their clients get the generic error
                del self._revoked[next(iter(self._revoked))]
            self._latest.pop(directory, None)
            return len(dropped)

    def held(self, number: int) -> bool:
        with self._lock:
            return number in self._versions
