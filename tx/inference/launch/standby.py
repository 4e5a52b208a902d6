"""A standby engine process: started when tx serve starts, its imports done, no model loaded, waiting for its
config. The first engine the launcher starts takes it, so the first sample does not wait for Python to import
torch, transformers and PEFT (most of an engine's start on a small model).

Design / who owns what:
- `Standby` spawns `python -m <kind.module>` with `STANDBY_ENV` set, stdin a pipe, in a private run directory
  of its own (its log there), in a session of its own like any engine (`process.py`).
- `take(config)` writes the config as one JSON line to its stdin and closes it: from then on it is an engine
  like one `spawn` started (the launcher waits for its ready file, stops its group). None when it died meanwhile
  (the launcher then spawns one as usual).
- A standby never taken ends with tx serve: `close` stops it, and its stdin closing (its parent gone) ends it too.
  It loads no model: a server whose runs never sample starts no engine.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tx.inference.engines.config import STANDBY_ENV, STANDBY_MODELS_ENV, EngineProcessConfig
from tx.inference.engines.kinds import EngineKind
from tx.inference.launch.process import stop

logger = logging.getLogger(__name__)


class Standby:
    def __init__(self, kind: EngineKind, work_dir: Path, model_dirs: list[Path],
                 env: dict[str, str] | None = None) -> None:
        """`env`: added to the process's environment (an engine's threads, read as its imports start)."""
        self.kind = kind
        self.run_dir = Path(work_dir) / f"standby-{uuid.uuid4().hex[:8]}"
        self.run_dir.mkdir(parents=True, mode=0o700)
        self.log_path = self.run_dir / "engine.log"
        environ = {**os.environ, **(env or {}), STANDBY_ENV: "1",
                   STANDBY_MODELS_ENV: os.pathsep.join(map(str, model_dirs))}
        with open(self.log_path, "ab") as log:
            self.process: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-P", "-m", kind.module], env=environ, stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        logger.info("%s standby process %d started (imports only, no model)", kind.label, self.process.pid)

    def take(self, config: EngineProcessConfig) -> subprocess.Popen | None:
        """Hand the standby `config` (its ready file in `run_dir`); the engine process, or None if it died."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None or process.stdin is None:
            return None
        if config.ready_file is not None:
            config.ready_file.unlink(missing_ok=True)
        try:
            process.stdin.write(config.model_dump_json().encode() + b"\n")
            process.stdin.close()
        except (BrokenPipeError, OSError):
            stop(process, self.kind.stop_timeout_s)
            return None
        return process

    def close(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()
            stop(process, self.kind.stop_timeout_s)
