"""The Ray actor that owns one engine process (embedded or vLLM) on its node.

The actor spawns the engine the launcher chose (`ENGINE_KINDS`: `python -m tx.inference.engines.embedded`
or `python -m tx.inference.engines.vllm`) as its child, config as JSON in the environment as the local
launchers do, with its run directory as working directory, and reports the URL the engine wrote to its
ready file. The child inherits what Ray set for the actor (CUDA_VISIBLE_DEVICES from the bundle) plus the
placement's extra environment.

When the actor dies (`ray.kill`), Ray SIGKILLs its child processes. The embedded engine is one process,
so it is gone. The vLLM engine runs in a session of its own, and its process group outlives it (vLLM's
server, engine core, workers); tx's vLLM process leaves a watcher in that group that ends the group when
tx's process dies, however it dies. `stop` ends the engine gracefully first (for vLLM: its whole group).

`wait_exit` stays pending while the engine runs: its result is the engine's exit code, and it fails
with Ray's actor error once the actor dies. The launcher reads liveness from it without a round trip.

Plain class: the launcher applies `ray.remote` to it, so importing this module needs no Ray.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LOG_TAIL_CHARS = 2000


@dataclass(frozen=True)
class EngineKind:
    """How the actor runs one kind of engine: its config class and its process functions."""

    config: type  # an `EngineProcessConfig`
    spawn: Callable[..., subprocess.Popen]  # (config, **popen_kwargs)
    wait_ready: Callable[..., str]  # (config, process, timeout_s) -> url
    stop: Callable[..., None]  # (process, timeout_s)


def engine_kind(kind: str) -> EngineKind:
    if kind == "embedded":
        from tx.inference.engines.embedded.config import EmbeddedEngineConfig
        from tx.inference.engines.embedded.process import spawn_engine, stop_engine, wait_ready

        return EngineKind(EmbeddedEngineConfig, spawn_engine, wait_ready, stop_engine)
    if kind == "vllm":
        from tx.inference.engines.vllm.config import VllmEngineConfig
        from tx.inference.engines.vllm.launch import spawn_vllm_engine, stop_process_group, wait_vllm_ready

        return EngineKind(VllmEngineConfig, spawn_vllm_engine, wait_vllm_ready, stop_process_group)
    raise ValueError(f"unknown engine kind {kind!r}: embedded or vllm")


class EngineActor:
    """Runs one engine of `kind` as a child process of this actor."""

    def __init__(self, name: str, kind: str, engine_fields: dict, env: dict[str, str], work_dir: str | None,
                 driver_node_ip: str | None) -> None:
        import ray  # inside the actor process Ray is always there

        self.kind = engine_kind(kind)
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
        if "stash_dir" in self.kind.config.model_fields:  # the embedded engine stashes weights on sleep
            engine_fields = {**engine_fields, "stash_dir": stash}
        self.config = self.kind.config(**engine_fields, ready_file=self.run_dir / "ready.json")
        with open(self.run_dir / "engine.log", "ab") as log:
            self.process = self.kind.spawn(self.config, stdout=log, stderr=subprocess.STDOUT, cwd=self.run_dir)

    async def ready(self, timeout_s: float) -> dict:
        """The engine's URL and pid once it serves; RuntimeError (with its log's tail) if it fails first."""
        try:
            url = await asyncio.to_thread(self.kind.wait_ready, self.config, self.process, timeout_s)
        except RuntimeError as exc:
            await asyncio.to_thread(self.kind.stop, self.process, 10.0)
            raise RuntimeError(f"{exc}\n{self.log_tail()}") from exc
        return {"url": url, "pid": self.process.pid, "node_ip": self.node_ip, "run_dir": str(self.run_dir),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    async def wait_exit(self, poll_s: float = 0.2) -> int:
        """Returns the engine's exit code once it exits (pending while it runs)."""
        while self.process.poll() is None:
            await asyncio.sleep(poll_s)
        return self.process.returncode

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate the engine (SIGTERM, then SIGKILL after `timeout_s`)."""
        await asyncio.to_thread(self.kind.stop, self.process, timeout_s)

    def log_tail(self) -> str:
        return (self.run_dir / "engine.log").read_text(errors="replace")[-LOG_TAIL_CHARS:]
