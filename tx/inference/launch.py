"""Where engines run: the `Launcher` seam, and local subprocesses (the default).

A launcher starts one engine (any engine serving `tx/inference/protocol.py`) for a model directory
and hands back an `EngineHandle`: a URL the manager talks to, and whether it is still alive. Other
launchers (Ray actors, vLLM servers) implement the same two protocols.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tx.inference.engines.config import EngineDtype
from tx.inference.engines.embedded.config import EmbeddedEngineConfig
from tx.inference.engines.embedded.process import stop_engine
from tx.inference.engines.process import engine_kind, start_logged

logger = logging.getLogger(__name__)


class EngineHandle(Protocol):
    name: str
    url: str

    @property
    def alive(self) -> bool: ...

    @property
    def pid(self) -> int | None: ...


class Launcher(Protocol):
    secret: str

    async def start(self, name: str, model_dir: Path) -> EngineHandle: ...

    async def stop(self, engine: EngineHandle) -> None: ...

    async def close(self) -> None: ...


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


class LocalLauncher:
    """Starts embedded engines as child processes bound to loopback."""

    def __init__(self, work_dir: Path, secret: str, *, host: str = "127.0.0.1", device: str = "auto",
                 max_adapters: int = 8, dtype: EngineDtype = "float32",
                 startup_timeout_s: float = 300.0) -> None:
        """`device`: where every engine runs (auto: the first CUDA GPU if any, else cpu); `dtype`: their base
        weights' (tx serve passes the trainer's)."""
        self.work_dir = work_dir
        self.secret = secret
        self.host = host
        self.device = device
        self.max_adapters = max_adapters
        self.dtype: EngineDtype = dtype
        self.startup_timeout_s = startup_timeout_s

    async def start(self, name: str, model_dir: Path) -> EngineProcess:
        run_dir = self.work_dir / f"{name}-{uuid.uuid4().hex[:8]}"
        run_dir.mkdir(parents=True)
        (run_dir / "stash").mkdir(mode=0o700)
        config = EmbeddedEngineConfig(
            model_dir=model_dir, cluster_secret=self.secret, host=self.host, port=0,
            ready_file=run_dir / "ready.json", stash_dir=run_dir / "stash", max_adapters=self.max_adapters,
            device=self.device, dtype=self.dtype,
        )
        try:
            process, url = await asyncio.to_thread(
                start_logged, engine_kind("embedded"), config, run_dir / "engine.log", self.startup_timeout_s
            )
        except RuntimeError as exc:
            raise RuntimeError(f"engine {name} failed to start: {exc}") from exc
        logger.info("engine %s (pid %d) serving %s at %s", name, process.pid, model_dir, url)
        return EngineProcess(name=name, url=url, process=process)

    async def stop(self, engine: EngineHandle) -> None:
        assert isinstance(engine, EngineProcess)
        await asyncio.to_thread(stop_engine, engine.process)

    async def close(self) -> None:
        """Nothing to release: every engine process is stopped through `stop`."""
