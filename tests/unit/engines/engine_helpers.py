"""A live engine process for tests: started with a random secret, driven with httpx."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx

from tx.inference.engines.embedded import EmbeddedEngineConfig
from tx.inference.engines.kinds import EMBEDDED
from tx.inference.engines.process import spawn, stop, wait_ready
from tx.inference.protocol import SECRET_HEADER

SECRET = "test-secret-" + uuid.uuid4().hex


class Engine:
    """A running engine process and an httpx client that sends the secret."""

    def __init__(self, config: EmbeddedEngineConfig) -> None:
        self.config = config
        self.process = spawn(EMBEDDED, config)
        self.url = wait_ready(config, self.process, timeout_s=180)
        self.client = httpx.Client(base_url=self.url, headers={SECRET_HEADER: SECRET}, timeout=120)

    @property
    def pid(self) -> int:
        return self.process.pid

    def post(self, path: str, body: dict | None = None, expect: int = 200) -> dict:
        response = self.client.post(path, json=body if body is not None else {})
        assert response.status_code == expect, response.text
        return response.json()

    def generate(self, **body) -> dict:
        return self.post("/generate", body)

    def health(self) -> dict:
        return self.client.get("/health").json()

    def close(self) -> None:
        self.client.close()
        stop(self.process, EMBEDDED.stop_timeout_s)


def start_engine(model_dir: Path, tmp_dir: Path, **overrides) -> Engine:
    config = EmbeddedEngineConfig(
        model_dir=model_dir, cluster_secret=SECRET, ready_file=tmp_dir / "ready.json", stash_dir=tmp_dir,
        num_threads=1, **{"device": "cpu", **overrides},
    )
    return Engine(config)
