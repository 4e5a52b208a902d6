"""The embedded engine's configuration, passed to its process as JSON (never as argv flags).

The parent sets `TX_ENGINE_CONFIG` (the JSON itself) or `TX_ENGINE_CONFIG_FILE` (a path to it) and runs
`python -m tx.inference.engines.embedded`. Once the engine serves, it writes `{"url": ..., "pid": ...}` to
`ready_file` (atomically), which `read_ready_file` reads back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

CONFIG_ENV = "TX_ENGINE_CONFIG"
CONFIG_FILE_ENV = "TX_ENGINE_CONFIG_FILE"


class EmbeddedEngineConfig(BaseModel):
    """Everything one embedded engine process needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_dir: Path = Field(description="a local HF model directory (config, safetensors, tokenizer if any)")
    cluster_secret: str = Field(min_length=8, description="required in X-TX-Cluster-Secret on every route")
    host: str = Field(default="127.0.0.1", description="loopback or a private cluster address only")
    port: int = Field(default=0, ge=0, le=65535, description="0 = pick a free port")
    ready_file: Path | None = Field(default=None, description="written with the URL once the engine serves")
    max_batch_size: int = Field(default=32, ge=1, description="most sequences (rows) decoded together")
    max_adapters: int = Field(default=8, ge=0, description="most LoRA adapters loaded at once")
    batch_wait_s: float = Field(default=0.005, ge=0, description="gather window: wait while requests keep arriving")
    num_threads: int | None = Field(default=None, ge=1, description="torch intra-op threads; default: all")
    stash_dir: Path | None = Field(default=None, description="where level-1 sleep stashes weights (private)")
    device: str = Field(default="auto", description="auto (cuda when available, else cpu), cpu, cuda, cuda:N")
    exit_with_parent: bool = Field(default=True, description="exit when the parent process goes away")
    log_level: str = "info"

    def to_env(self) -> dict[str, str]:
        """The environment entries that hand this config to a child process."""
        return {CONFIG_ENV: self.model_dump_json()}

    @classmethod
    def from_env(cls) -> EmbeddedEngineConfig:
        if CONFIG_ENV in os.environ:
            return cls.model_validate_json(os.environ[CONFIG_ENV])
        if CONFIG_FILE_ENV in os.environ:
            return cls.model_validate_json(Path(os.environ[CONFIG_FILE_ENV]).read_text())
        raise ValueError(f"set {CONFIG_ENV} (JSON) or {CONFIG_FILE_ENV} (a path to JSON)")


def write_ready_file(path: Path, url: str) -> None:
    """Atomically write the engine's URL and pid to `path`."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    os.replace(tmp, path)


def read_ready_file(path: Path) -> str | None:
    """The URL an engine wrote to `path`, or None while it is not ready."""
    try:
        return json.loads(Path(path).read_text())["url"]
    except FileNotFoundError:
        return None
