"""`LocalLauncher`: engines as child processes of this one (the default `Launcher`, `launch/base.py`).

It starts engines of one kind (`engines/kinds.py`: embedded or vLLM); `launch/ray_launcher.py` starts them as
Ray actors instead. Both run them through `launch/process.py`.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tx.inference.engines.kinds import EngineKind, engine_kind
from tx.inference.launch.base import EngineHandle, Launcher  # noqa: F401 (the seam LocalLauncher implements)
from tx.inference.launch.process import STARTUP_GRACE_S, run_config, start_logged, stop, wait_logged
from tx.inference.launch.standby import Standby

logger = logging.getLogger(__name__)


@dataclass
class EngineProcess:
    name: str
    url: str
    process: subprocess.Popen

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def pid(self) -> int:
        return self.process.pid


def engine_env(kind: EngineKind, threads: int, cpus: list[int]) -> dict[str, str]:
    """The environment that holds an engine of `kind` to `threads` CPU threads (on CPU). vLLM sets its own
    thread count from the CPUs it binds to (all of a NUMA node unless told): it gets the last `threads` of
    `cpus`, the CPUs this process may use."""
    env = {"OMP_NUM_THREADS": str(threads)}
    if kind.name == "vllm":
        chosen = sorted(cpus)[-threads:] if cpus else list(range(threads))
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(cpu) for cpu in chosen)
    return env


class LocalLauncher:
    """Starts engines of one kind as child processes bound to `host` (loopback or a private address), each
    in a private run directory under `work_dir` (its log, its ready file, the embedded engine's stash)."""

    def __init__(self, work_dir: Path, secret: str, *, kind: EngineKind | str = "embedded",
                 host: str = "127.0.0.1", max_adapters: int = 8, startup_timeout_s: float | None = None,
                 standby_for: list[Path] | None = None, env: dict[str, str] | None = None,
                 **engine_options: Any) -> None:
        """`engine_options`: more fields of the kind's config (embedded: device, dtype, num_threads; vLLM:
        dtype, max_lora_rank, gpu_memory_utilization, extra_args, ...). `startup_timeout_s`: the kind's
        default unless given. A kind that cannot run here (no vLLM) fails now, not at the first sample.
        `standby_for`: start a standby process now (`standby.py`, a kind that has one), its imports done
        and these models' classes imported; the first engine started takes it. `env`: added to each engine's
        environment, the standby's too (its threads: `engine_env`)."""
        self.kind = engine_kind(kind) if isinstance(kind, str) else kind
        self.kind.require(engine_options)
        self.work_dir = Path(work_dir)
        self.secret = secret
        self.host = host
        self.max_adapters = max_adapters
        self.startup_timeout_s = startup_timeout_s or self.kind.startup_timeout_s
        self.engine_options = engine_options
        self.env = dict(env or {})
        self._starting: set[subprocess.Popen] = set()  # spawned, not yet serving
        self._closed = False
        self._standby: Standby | None = None
        if standby_for is not None and self.kind.standby:
            self._standby = Standby(self.kind, self.work_dir, standby_for, self.env)

    async def start(self, name: str, model_dir: Path) -> EngineProcess:
        if self._closed:
            raise RuntimeError(f"the server is shutting down: {self.kind.label} {name} is not started")
        standby, self._standby = self._standby, None
        if standby is not None:
            run_dir = standby.run_dir
        else:
            run_dir = self.work_dir / f"{name}-{uuid.uuid4().hex[:8]}"
            run_dir.mkdir(parents=True, mode=0o700)
        config = run_config(self.kind, run_dir, self.startup_timeout_s, model_dir=model_dir, port=0,
                            cluster_secret=self.secret, host=self.host, max_adapters=self.max_adapters,
                            **self.engine_options)
        log, timeout_s = run_dir / "engine.log", self.startup_timeout_s + STARTUP_GRACE_S
        spawned: list[subprocess.Popen] = []

        def on_spawn(process: subprocess.Popen) -> None:
            spawned.append(process)
            self._starting.add(process)

        taken = standby.take(config) if standby is not None else None
        if taken is not None:
            on_spawn(taken)
        try:
            if taken is not None:
                url = await asyncio.to_thread(wait_logged, self.kind, config, taken, log, timeout_s)
                process = taken
            else:
                process, url = await asyncio.to_thread(
                    start_logged, self.kind, config, log, timeout_s, on_spawn=on_spawn, env=self.env
                )
        except RuntimeError as exc:
            if self._closed:
                raise RuntimeError(f"the server shut down while {self.kind.label} {name} started") from exc
            raise RuntimeError(f"{self.kind.label} {name} failed to start: {exc}") from exc
        finally:
            self._starting.difference_update(spawned)
        if self._closed:  # it became ready just as the server shut down
            await asyncio.to_thread(stop, process, self.kind.stop_timeout_s)
            raise RuntimeError(f"the server shut down while {self.kind.label} {name} started")
        logger.info("%s %s (pid %d) serving %s at %s", self.kind.label, name, process.pid, model_dir, url)
        return EngineProcess(name=name, url=url, process=process)

    async def stop(self, engine: EngineHandle) -> None:
        assert isinstance(engine, EngineProcess)
        await asyncio.to_thread(stop, engine.process, self.kind.stop_timeout_s)

    async def close(self) -> None:
        """Stop the engines still starting (a serving one is stopped through `stop`) and the standby, and start no
        more."""
        self._closed = True
        standby, self._standby = self._standby, None
        if standby is not None:
            await asyncio.to_thread(standby.close)
        for process in list(self._starting):
            await asyncio.to_thread(stop, process, self.kind.stop_timeout_s)
