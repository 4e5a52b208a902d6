"""The Ray actor that owns one engine process (embedded or vLLM) on its node.

The actor spawns an engine of the kind the launcher chose (`engines/kinds.py`) as its child, through
`launch/process.py` as the local launcher does, with its run directory as working directory, and reports
the URL the engine wrote to its ready file. The child inherits what Ray set for the actor
(CUDA_VISIBLE_DEVICES from the bundle) plus the placement's extra environment.

When the actor dies (`ray.kill`), Ray SIGKILLs its child processes. The embedded engine is one process,
so it is gone. The vLLM engine runs in a session of its own, and its process group outlives it (vLLM's
server, engine core, workers); tx's vLLM process leaves a watcher in that group that ends the group when
tx's process dies, however it dies. `stop` ends the engine gracefully first, then its whole group.

`wait_exit` stays pending while the engine runs: its result is the engine's exit code, and it fails
with Ray's actor error once the actor dies. The launcher reads liveness from it without a round trip.

Plain class: the launcher applies `ray.remote` to it, so importing this module needs no Ray.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from tx.inference.engines.kinds import engine_kind
from tx.inference.launch.process import STARTUP_GRACE_S, run_config, start_logged, stop


class EngineActor:
    """Runs one engine of `kind` as a child process of this actor."""

    def __init__(self, name: str, kind: str, engine_fields: dict, env: dict[str, str], work_dir: str | None,
                 driver_node_id: str | None) -> None:
        """`driver_node_id`: the Ray node of the server; on another node the engine binds its node's address
        (two Ray nodes may share one machine's address, and still it serves as it would on another machine)."""
        import ray  # inside the actor process Ray is always there

        self.kind = engine_kind(kind)
        self.node_ip = ray.util.get_node_ip_address()
        node_id = ray.get_runtime_context().get_node_id()
        os.environ.update(env)
        if work_dir is None:
            self.run_dir = Path(tempfile.mkdtemp(prefix=f"tx-{name}-"))
        else:
            Path(work_dir).mkdir(parents=True, exist_ok=True)
            self.run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work_dir))
        if engine_fields.get("host") is None:  # loopback next to the server; the node's address elsewhere
            same_node = driver_node_id is not None and driver_node_id == node_id
            engine_fields = {**engine_fields, "host": "127.0.0.1" if same_node else self.node_ip}
        self.fields = engine_fields
        self.process = None

    async def ready(self, timeout_s: float) -> dict:
        """Start the engine (`timeout_s`: its startup bound); its URL and pid once it serves (RuntimeError
        with its log's tail if it fails)."""
        config = run_config(self.kind, self.run_dir, timeout_s, **self.fields)
        self.process, url = await asyncio.to_thread(
            start_logged, self.kind, config, self.run_dir / "engine.log", timeout_s + STARTUP_GRACE_S,
            cwd=self.run_dir,
        )
        return {"url": url, "pid": self.process.pid, "node_ip": self.node_ip, "run_dir": str(self.run_dir),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    async def wait_exit(self, poll_s: float = 0.2) -> int:
        """Returns the engine's exit code once it exits (pending while it runs)."""
        process = self.process
        assert process is not None, "ready() starts the engine first"
        while process.poll() is None:
            await asyncio.sleep(poll_s)
        return process.returncode

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate the engine (SIGTERM, then SIGKILL to its process group after `timeout_s`)."""
        if self.process is not None:
            await asyncio.to_thread(stop, self.process, timeout_s)
