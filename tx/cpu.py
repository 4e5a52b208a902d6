"""One machine's CPUs: the thread budget the trainer and the engines on it share, and the allocator and
OpenMP settings `tx serve` puts in the environment before torch loads. No torch import here: the server reads
this first.

The budget (`split_threads`): `total` threads (`--cpu-threads`; default the CPUs this process may run on)
split between the trainer and the engines tx starts on this machine. Each engine gets `engine` threads
(`--engine-threads`; default total / (engines + 1)), the trainer `trainer` (`--trainer-threads`; default what
the engines leave). Engines start lazily, so until one runs the trainer takes the whole `total`
(`trainer_threads`): a server that only trains uses every core, and one that samples beside its training
never runs more threads than cores. Two torch thread pools that together ask for more threads than cores
stall each other at every parallel region (a thread waits at a barrier for one that is not scheduled):
README.md's "CPU threads" and scripts/bench/train_beside_sampler.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# torch's CPU allocator: tensors of 2 MiB and more on transparent huge pages (madvise). The trainer maps every
# tensor of 8 MiB and more afresh (`tx/backends/torch/memory.py`); on 4 KiB pages each of those faulted in
# page by page (the bench step: 69k faults, 12% of its CPU time), on huge pages 7k.
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"
# OpenMP's wait policy (torch's CPU thread pool, libgomp): PASSIVE puts a thread that waits at a barrier to
# sleep at once; the default spins first (300,000 rounds), burning the core the thread that is late needs.
# On a box whose cores the server's own threads (HTTP, the store, the next request's decode), its engines or
# other processes also use, the spinning turned a 0.05 s step into 0.2-0.5 s (p90 1-3 s):
# docs/operations.md#the-training-steps-overhead.
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
# A trainer call of fewer floating-point operations than this runs on one of the trainer's threads
# (`pass_threads`): its ops are too small to split, and a second thread waiting at each of them, passively,
# costs more than it saves. In one process (the tiny Qwen3, 1.4 MFLOP a token; two threads against one): 8 x 64
# tokens 1.06x slower, 768-1,024 tokens 0.89-0.92x, from 2,048 tokens 0.59-0.71x; the ~21M bench model gains
# from two threads at every size (0.90x at 1 x 32 tokens). Through the server the second thread also takes the
# core its request handling and the client want during the pass: docs/operations.md#the-training-steps-overhead.
SMALL_PASS_FLOPS = 1e9


def use_huge_pages(env: MutableMapping[str, str] = os.environ) -> None:
    """Ask torch for huge pages on large CPU tensors, unless the environment already says. torch reads this
    once, at its first allocation: call it before torch is imported (child processes inherit it)."""
    env.setdefault(HUGE_PAGES_ENV, "1")


def use_cpu_defaults(env: MutableMapping[str, str] = os.environ) -> None:
    """What `tx serve` and `tx engine serve` put in the environment before torch loads, each unless set: huge
    pages for large tensors, and OpenMP threads that sleep rather than spin while they wait (read once, when
    the thread pool starts; engines and trainer workers inherit both)."""
    use_huge_pages(env)
    env.setdefault(WAIT_POLICY_ENV, "PASSIVE")


def cpu_ids() -> list[int]:
    """The CPUs this process may run on (its affinity mask), in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """CPUs this process may run on: its affinity mask, or fewer under a cgroup CPU quota."""
    cores = len(cpu_ids())
    quota = _cgroup_quota()
    return max(1, min(cores, quota) if quota else cores)


def _cgroup_quota(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """Whole CPUs a cgroup v2 quota allows ("max" or no file: None)."""
    try:
        limit, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if limit == "max":
        return None
    return max(1, int(limit) // int(period))


def pass_threads(share: int, flops: float) -> int:
    """The threads of one trainer call (a pass, an optimizer step) of about `flops` operations, out of the
    trainer's `share`: one for a call under `SMALL_PASS_FLOPS`, else the share."""
    return 1 if flops < SMALL_PASS_FLOPS else share


@dataclass(frozen=True)
class ThreadBudget:
    total: int  # threads of this machine's trainer and engines together
    trainer: int  # the trainer's, while an engine runs on this machine
    engine: int  # each local engine's
    local_engines: int  # engines tx may start on this machine

    def trainer_threads(self, engines_running: bool) -> int:
        """The trainer's threads now: the whole budget until an engine runs here, then its share."""
        return self.trainer if engines_running and self.local_engines else self.total

    @property
    def oversubscribed(self) -> bool:
        return self.local_engines > 0 and self.trainer + self.engine * self.local_engines > self.total


def split_threads(total: int | None, local_engines: int, *, trainer: int | None = None,
                  engine: int | None = None) -> ThreadBudget:
    """The budget for `local_engines` engines on this machine beside the trainer; `total`, `trainer` and
    `engine` override the defaults (module docstring). Overrides that ask for more than `total` are kept, with
    a warning: the operator chose them."""
    total = total or usable_cores()
    if engine is None:
        engine = max(1, total // (local_engines + 1))
    if trainer is None:
        trainer = max(1, total - engine * local_engines)
    budget = ThreadBudget(total=total, trainer=trainer, engine=engine, local_engines=local_engines)
    if budget.oversubscribed:
        logger.warning("thread budget: trainer %d + %d engine(s) x %d threads > %d: they will contend for cores",
                       trainer, local_engines, engine, total)
    return budget
