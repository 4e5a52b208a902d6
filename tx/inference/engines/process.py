"""An engine as a child process: started in its own session with its config in the environment, and
awaited until it writes its ready file (every engine kind does both the same way). `engine_kind` names the
functions of each kind; the local launchers and the Ray actor start engines through `start_logged`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tx.inference.engines.config import EngineProcessConfig, read_ready_file

LOG_TAIL_CHARS = 3000  # of an engine's log, in the error when it fails to start


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
    if config.ready_file is None:
        raise ValueError(f"waiting for the {what} needs config.ready_file to learn its URL")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        url = read_ready_file(config.ready_file)
        if url is not None:
            return url
        if process.poll() is not None:
            raise RuntimeError(f"{what} process exited with code {process.returncode} before it was ready")
        time.sleep(poll_s)
    raise RuntimeError(f"{what} not ready after {timeout_s:g} s")


@dataclass(frozen=True)
class EngineKind:
    """How to run one kind of engine as a process: its config class and its process functions."""

    config: type  # an `EngineProcessConfig`
    spawn: Callable[..., subprocess.Popen]  # (config, **popen_kwargs)
    wait_ready: Callable[..., str]  # (config, process, timeout_s) -> url
    stop: Callable[..., None]  # (process, timeout_s)


def engine_kind(kind: str) -> EngineKind:
    """The embedded engine or tx's vLLM engine (imported only when asked for)."""
    if kind == "embedded":
        from tx.inference.engines.embedded.config import EmbeddedEngineConfig
        from tx.inference.engines.embedded.process import spawn_engine, stop_engine, wait_ready

        return EngineKind(EmbeddedEngineConfig, spawn_engine, wait_ready, stop_engine)
    if kind == "vllm":
        from tx.inference.engines.vllm.config import VllmEngineConfig
        from tx.inference.engines.vllm.launch import spawn_vllm_engine, stop_process_group, wait_vllm_ready

        return EngineKind(VllmEngineConfig, spawn_vllm_engine, wait_vllm_ready, stop_process_group)
    raise ValueError(f"unknown engine kind {kind!r}: embedded or vllm")


def start_logged(kind: EngineKind, config: EngineProcessConfig, log_path: Path, timeout_s: float,
                 **popen_kwargs) -> tuple[subprocess.Popen, str]:
    """Spawn an engine writing to `log_path` and wait until it serves: (process, url). If it fails first, it
    is stopped and the RuntimeError carries the log's tail. Blocking: run it in a thread."""
    with open(log_path, "ab") as log:
        process = kind.spawn(config, stdout=log, stderr=subprocess.STDOUT, **popen_kwargs)
    try:
        return process, kind.wait_ready(config, process, timeout_s)
    except RuntimeError as exc:
        kind.stop(process, 10.0)
        tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        raise RuntimeError(f"{exc}\n{tail}") from exc
