"""An engine as a child process: started in its own session with its config in the environment, and
awaited until it writes its ready file (every engine kind does both the same way)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tx.inference.engines.config import EngineProcessConfig, read_ready_file


def spawn_engine_process(module: str, config: EngineProcessConfig, **popen_kwargs) -> subprocess.Popen:
    """Run `python -m <module>` with `config` in its environment, in a new session (its own process group)."""
    if config.ready_file is None:
        raise ValueError(f"starting {module} needs config.ready_file to learn the engine's URL")
    config.ready_file.unlink(missing_ok=True)
    env = {**os.environ, **popen_kwargs.pop("env", {}), **config.to_env()}
    return subprocess.Popen([sys.executable, "-m", module], env=env, start_new_session=True, **popen_kwargs)


def wait_engine_ready(config: EngineProcessConfig, process: subprocess.Popen, timeout_s: float,
                      what: str = "engine", poll_s: float = 0.05) -> str:
    """The engine's URL once it wrote its ready file; RuntimeError if it exits or times out first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        url = read_ready_file(config.ready_file)
        if url is not None:
            return url
        if process.poll() is not None:
            raise RuntimeError(f"{what} process exited with code {process.returncode} before it was ready")
        time.sleep(poll_s)
    raise RuntimeError(f"{what} not ready after {timeout_s:g} s")
