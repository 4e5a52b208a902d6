"""An engine as a child process, the same way for every kind (`engines/kinds.py`) and every launcher.

- `run_config`: the config of one engine run in a private run directory (its ready file there, and the
  private stash dir or the startup bound where the kind's config has one).
- `spawn`: `python -m <kind.module>` with the config in its environment, in a session (process group) of its
  own, `python` being the config's (`EngineProcessConfig.interpreter`); `wait_ready` waits for its ready file;
  `stop` SIGTERMs it, then SIGKILLs whatever is left of its group (tx's vLLM process, the vLLM server, its
  engine core and workers), so nothing is orphaned.
- `start_logged` does all three for a launcher: output to a log file, whose tail is in the error if the
  engine fails to start. Blocking: launchers run it in a thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tx.inference.engines.config import EngineProcessConfig, read_ready_file
from tx.inference.engines.kinds import EngineKind

LOG_TAIL_CHARS = 3000  # of an engine's log, in the error when it fails to start
STARTUP_GRACE_S = 30.0  # a launcher waits this much longer than an engine's own startup bound
READY_POLL_S = 0.05


def run_config(kind: EngineKind, run_dir: Path, startup_timeout_s: float,
               **fields: Any) -> EngineProcessConfig:
    """`kind`'s config from `fields` for an engine run in `run_dir` (which exists and is private): its ready
    file there, a 0700 `stash` dir for weights slept to disk (embedded), and `startup_timeout_s` as the
    engine's own bound on starting (vLLM's)."""
    extra: dict[str, Any] = {"ready_file": run_dir / "ready.json"}
    wants = kind.config.model_fields
    if "stash_dir" in wants:
        (run_dir / "stash").mkdir(mode=0o700, exist_ok=True)
        extra["stash_dir"] = run_dir / "stash"
    if "startup_timeout_s" in wants:
        extra["startup_timeout_s"] = startup_timeout_s
    return kind.config(**{**extra, **fields})


def spawn(kind: EngineKind, config: EngineProcessConfig, **popen_kwargs: Any) -> subprocess.Popen:
    """Run `python -P -m <kind.module>` with `config` in its environment, in a new session (its own group)."""
    if config.ready_file is None:
        raise ValueError(f"starting {kind.label} needs config.ready_file to learn the engine's URL")
    config.ready_file.unlink(missing_ok=True)
    env = {**os.environ, **popen_kwargs.pop("env", {}), **config.to_env()}
    command = [config.interpreter(), "-P", "-m", kind.module]  # -P: no `tx/` in the cwd shadows tx's code
    return subprocess.Popen(command, env=env, start_new_session=True, **popen_kwargs)


def wait_ready(config: EngineProcessConfig, process: subprocess.Popen, timeout_s: float,
               what: str = "engine") -> str:
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
        time.sleep(READY_POLL_S)
    raise RuntimeError(f"{what} not ready after {timeout_s:g} s")


def stop(process: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM the engine and wait up to `timeout_s`, then SIGKILL whatever is left of its process group
    (its group id is its pid: `spawn` starts it in a new session)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.poll() is None:
        process.wait(timeout=timeout_s)


def start_logged(kind: EngineKind, config: EngineProcessConfig, log_path: Path, timeout_s: float, *,
                 on_spawn: Callable[[subprocess.Popen], None] | None = None,
                 **popen_kwargs: Any) -> tuple[subprocess.Popen, str]:
    """Spawn an engine writing to `log_path` and wait until it serves: (process, url). If it fails first, it
    is stopped and the RuntimeError carries the log's tail. `on_spawn` learns the process before the wait
    (a launcher that closes meanwhile stops it). Blocking: run it in a thread."""
    with open(log_path, "ab") as log:
        process = spawn(kind, config, stdout=log, stderr=subprocess.STDOUT, **popen_kwargs)
    if on_spawn is not None:
        on_spawn(process)
    return process, wait_logged(kind, config, process, log_path, timeout_s)


def wait_logged(kind: EngineKind, config: EngineProcessConfig, process: subprocess.Popen, log_path: Path,
                timeout_s: float) -> str:
    """`wait_ready` for an engine writing to `log_path`; if it fails, it is stopped and the RuntimeError carries
    the log's tail."""
    try:
        return wait_ready(config, process, timeout_s, what=kind.label)
    except RuntimeError as exc:
        stop(process, 10.0)
        tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        raise RuntimeError(f"{exc}\n{tail}") from exc


__all__ = ["LOG_TAIL_CHARS", "STARTUP_GRACE_S", "run_config", "spawn", "start_logged", "stop", "wait_logged",
           "wait_ready"]
