"""Starting an embedded engine as a child process and waiting until it serves (for tests and launchers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tx.inference.engines.embedded.config import EmbeddedEngineConfig, read_ready_file


def spawn_engine(config: EmbeddedEngineConfig, **popen_kwargs) -> subprocess.Popen:
    """Run `python -m tx.inference.engines.embedded` with `config` in its environment, in its own session."""
    if config.ready_file is None:
        raise ValueError("spawn_engine needs config.ready_file to learn the engine's URL")
    config.ready_file.unlink(missing_ok=True)
    env = {**os.environ, **popen_kwargs.pop("env", {}), **config.to_env()}
    return subprocess.Popen(
        [sys.executable, "-m", "tx.inference.engines.embedded"],
        env=env,
        start_new_session=True,
        **popen_kwargs,
    )


def wait_ready(config: EmbeddedEngineConfig, process: subprocess.Popen, timeout_s: float = 120.0) -> str:
    """The engine's URL once it wrote its ready file; RuntimeError if it exits or times out first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        url = read_ready_file(config.ready_file)
        if url is not None:
            return url
        if process.poll() is not None:
            raise RuntimeError(f"engine process exited with code {process.returncode} before it was ready")
        time.sleep(0.05)
    raise RuntimeError(f"engine not ready after {timeout_s} s")


def stop_engine(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Terminate the engine, then kill it if it does not exit in time."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)
