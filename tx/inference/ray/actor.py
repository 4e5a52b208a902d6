"""The Ray actor that owns one embedded engine process on its node.

The actor spawns `python -m tx.inference.engines.embedded` as its child (config as JSON in the
environment, as `LocalLauncher` does) and reports the URL the engine wrote to its ready file. The child
inherits what Ray set for the actor (CUDA_VISIBLE_DEVICES from the bundle) plus the placement's extra
environment. The engine exits when its parent goes away, so `ray.kill` on the actor also ends the
engine (within about a second); `stop` ends it gracefully first.

`wait_exit` stays pending while the engine runs: its result is the engine's exit code, and it fails
with Ray's actor error once the actor dies. The launcher reads liveness from it without a round trip.

Plain class: the launcher applies `ray.remote` to it, so importing this module needs no Ray.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from pathlib import Path

from tx.inference.engines.embedded.config import EmbeddedEngineConfig
from tx.inference.engines.embedded.process import spawn_engine, stop_engine, wait_ready

LOG_TAIL_CHARS = 2000


class EngineActor:
    """Runs one embedded engine as a child process of this actor."""

    def __init__(self, name: str, engine_fields: dict, env: dict[str, str], work_dir: str | None,
                 driver_node_ip: str | None) -> None:
        import ray  # inside the actor process Ray is always there

        self.node_ip = ray.util.get_node_ip_address()
        os.environ.update(env)
        if work_dir is None:
            self.run_dir = Path(tempfile.mkdtemp(prefix=f"tx-{name}-"))
        else:
            Path(work_dir).mkdir(parents=True, exist_ok=True)
            self.run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work_dir))
        stash = self.run_dir / "stash"
        stash.mkdir(mode=0o700)
        if engine_fields.get("host") is None:  # loopback next to the server; the node's address elsewhere
            same_node = driver_node_ip is not None and driver_node_ip == self.node_ip
            engine_fields = {**engine_fields, "host": "127.0.0.1" if same_node else self.node_ip}
        ready_file = self.run_dir / "ready.json"
        self.config = EmbeddedEngineConfig(**engine_fields, ready_file=ready_file, stash_dir=stash)
        with open(self.run_dir / "engine.log", "ab") as log:
            self.process = spawn_engine(self.config, stdout=log, stderr=subprocess.STDOUT)

    async def ready(self, timeout_s: float) -> dict:
        """The engine's URL and pid once it serves; RuntimeError (with its log's tail) if it fails first."""
        try:
            url = await asyncio.to_thread(wait_ready, self.config, self.process, timeout_s)
        except RuntimeError as exc:
            stop_engine(self.process)
            raise RuntimeError(f"{exc}\n{self.log_tail()}") from exc
        return {"url": url, "pid": self.process.pid, "node_ip": self.node_ip,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    async def wait_exit(self, poll_s: float = 0.2) -> int:
        """Returns the engine's exit code once it exits (pending while it runs)."""
        while self.process.poll() is None:
            await asyncio.sleep(poll_s)
        return self.process.returncode

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate the engine (SIGTERM, then SIGKILL after `timeout_s`)."""
        await asyncio.to_thread(stop_engine, self.process, timeout_s)

    def log_tail(self) -> str:
        return (self.run_dir / "engine.log").read_text(errors="replace")[-LOG_TAIL_CHARS:]
