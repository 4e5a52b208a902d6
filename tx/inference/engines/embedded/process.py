"""Starting an embedded engine as a child process and waiting until it serves (for tests and launchers)."""

from __future__ import annotations

import subprocess

from tx.inference.engines.embedded.config import EmbeddedEngineConfig
from tx.inference.engines.process import spawn_engine_process, wait_engine_ready


def spawn_engine(config: EmbeddedEngineConfig, **popen_kwargs) -> subprocess.Popen:
    """Run `python -m tx.inference.engines.embedded` with `config` in its environment, in its own session."""
    return spawn_engine_process("tx.inference.engines.embedded", config, **popen_kwargs)


def wait_ready(config: EmbeddedEngineConfig, process: subprocess.Popen, timeout_s: float = 120.0) -> str:
    """The engine's URL once it wrote its ready file; RuntimeError if it exits or times out first."""
    return wait_engine_ready(config, process, timeout_s)


def stop_engine(process: subprocess.Popen, timeout_s: float = 2.0) -> None:
    """Terminate the engine, then kill it if it does not exit in time (it keeps nothing that a kill loses)."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)
