"""`VllmLauncher`: tx's `Launcher` for vLLM engines, each a local `python -m tx.inference.engines.vllm` process.

Every engine runs in a session (process group) of its own; `stop` ends the whole group (tx's process, the
vLLM server, its engine core and workers), so nothing is orphaned even if a process is stuck in a collective.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

from tx.inference.engines.process import engine_kind, spawn_engine_process, start_logged, wait_engine_ready
from tx.inference.engines.vllm import require_vllm
from tx.inference.engines.vllm.config import VllmEngineConfig
from tx.inference.launch import EngineHandle, EngineProcess

logger = logging.getLogger(__name__)


def spawn_vllm_engine(config: VllmEngineConfig, **popen_kwargs) -> subprocess.Popen:
    """Run `python -m tx.inference.engines.vllm` with `config` in its environment, in a new session."""
    return spawn_engine_process("tx.inference.engines.vllm", config, **popen_kwargs)


def wait_vllm_ready(config: VllmEngineConfig, process: subprocess.Popen, timeout_s: float) -> str:
    """The engine's URL once it wrote its ready file; RuntimeError if it exits or times out first."""
    return wait_engine_ready(config, process, timeout_s, what="vLLM engine", poll_s=0.2)


def stop_process_group(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM the engine (it stops vLLM), then SIGKILL whatever is left of its process group."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the group id is the engine's pid (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass
    if process.poll() is None:
        process.wait(timeout=timeout_s)


class VllmLauncher:
    """Starts vLLM engines bound to `host` (loopback or a private address) behind the cluster secret."""

    def __init__(
        self,
        work_dir: Path,
        secret: str,
        *,
        host: str = "127.0.0.1",
        max_adapters: int = 8,
        startup_timeout_s: float = 600.0,
        **engine_options: Any,
    ) -> None:
        """`engine_options`: more `VllmEngineConfig` fields (dtype, max_lora_rank, extra_args, ...)."""
        require_vllm()  # a missing or unsupported vLLM fails here, at server start, not at the first sample
        self.work_dir = Path(work_dir)
        self.secret = secret
        self.host = host
        self.max_adapters = max_adapters
        self.startup_timeout_s = startup_timeout_s
        self.engine_options = engine_options

    def config_for(self, run_dir: Path, model_dir: Path) -> VllmEngineConfig:
        return VllmEngineConfig(
            model_dir=model_dir,
            cluster_secret=self.secret,
            host=self.host,
            port=0,
            ready_file=run_dir / "ready.json",
            max_adapters=self.max_adapters,
            startup_timeout_s=self.startup_timeout_s,
            **self.engine_options,
        )

    async def start(self, name: str, model_dir: Path) -> EngineProcess:
        run_dir = self.work_dir / f"{name}-{uuid.uuid4().hex[:8]}"
        run_dir.mkdir(parents=True, mode=0o700)
        config = self.config_for(run_dir, model_dir)
        try:
            process, url = await asyncio.to_thread(
                start_logged, engine_kind("vllm"), config, run_dir / "engine.log", self.startup_timeout_s + 30
            )
        except RuntimeError as exc:
            raise RuntimeError(f"vLLM engine {name} failed to start: {exc}") from exc
        logger.info("vLLM engine %s (pid %d) serving %s at %s", name, process.pid, model_dir, url)
        return EngineProcess(name=name, url=url, process=process)

    async def stop(self, engine: EngineHandle) -> None:
        assert isinstance(engine, EngineProcess)
        await asyncio.to_thread(stop_process_group, engine.process)

    async def close(self) -> None:
        """Nothing to release: every engine process group is stopped through `stop`."""
