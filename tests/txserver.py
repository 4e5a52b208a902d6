"""Start a real `tx serve` process on a free loopback port, for tests and benchmarks.

In a fixture: `with TxServer(dir, args=[...]) as server: yield server` (stopped at teardown, and also when the
fixture fails), and `with server.client() as client: yield client` (its session finished while the server
still runs).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
import tinker

API_KEY = "tml-test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TxServer:
    data_dir: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    cwd: Path | None = None  # the server's working directory (None: the test's)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> Self:
        self.port = self.port or free_port()
        self.log_path = self.data_dir / f"server-{self.port}.log"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TX_LOG_LEVEL": "INFO", **self.env}
        # -P: tx's own code, not a `tx/` in `cwd` (as the `tx` script runs, its own folder first on the path)
        cmd = [sys.executable, "-P", "-m", "tx.cli", "serve", "--port", str(self.port),
               "--data-dir", str(self.data_dir), *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=self.cwd)
        try:
            wait_healthy("tx serve", f"{self.url}/api/v1/healthz", self.proc, timeout_s, self.log)
        except BaseException:
            self.stop()  # not left running behind a failed fixture, a timeout or a Ctrl-C
            raise
        return self

    def __enter__(self) -> Self:
        """Starts the server unless it runs (`with server.start(timeout_s=...)` starts it with options)."""
        return self.start() if self.proc is None or self.proc.poll() is not None else self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @contextmanager
    def client(self, api_key: str = API_KEY, **options: Any) -> Iterator[tinker.ServiceClient]:
        """A ServiceClient of this server whose session is finished on exit, and waited for: a session left
        open keeps heartbeating after the server stops, and the SDK warns about it at the end of the run. If
        the server was stopped meanwhile (a test that stops it), the client is abandoned instead: a finish
        would be retried for minutes."""
        client = tinker.ServiceClient(base_url=self.url, api_key=api_key, **options)
        try:
            yield client
        finally:
            if self.proc is not None and self.proc.poll() is None:
                client.close("success").result()
            else:
                abandon(client)

    def engine_groups(self) -> list[dict[str, Any]]:
        """The engine groups as `GET /api/v1/tx/engines` shows them."""
        answer = httpx.get(f"{self.url}/api/v1/tx/engines", headers={"X-API-Key": API_KEY}, timeout=60)
        answer.raise_for_status()
        return answer.json()["groups"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self) -> None:
        stop_group(self.proc, 20)

    def client_env(self) -> dict[str, str]:
        return {"TINKER_BASE_URL": self.url, "TINKER_API_KEY": API_KEY, "TINKER_TELEMETRY": "0"}


def wait_healthy(name: str, url: str, proc: subprocess.Popen, timeout_s: float, log: Callable[[], str]) -> None:
    """Until GET `url` answers 200: RuntimeError (with `log()`) if `proc`, called `name`, exits first,
    TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{name} not healthy after {timeout_s}s:\n{log()}")


def stop_group(proc: subprocess.Popen | None, timeout_s: float) -> None:
    """SIGTERM the process group `proc` leads (started with start_new_session), SIGKILL it after `timeout_s`."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def abandon(client: tinker.ServiceClient) -> None:
    """Stop the heartbeats of a client whose server was killed, as a crashed user's process would: its session
    cannot be finished any more, and the SDK would warn about failed heartbeats for the rest of the run."""
    client.holder.close()
