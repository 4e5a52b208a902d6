"""What every engine process shares: its config's common fields, handed over as JSON in the environment, and
the ready file it writes once it serves.

The parent sets `TX_ENGINE_CONFIG` (the JSON itself) or `TX_ENGINE_CONFIG_FILE` (a path to it) and runs the
engine's module (`python -m tx.inference.engines.embedded` or `.vllm`), which reads it with `from_env`.
Once the engine serves, it writes `{"url": ..., "pid": ...}` to `ready_file` (atomically), which
`read_ready_file` reads back.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field

CONFIG_ENV = "TX_ENGINE_CONFIG"
CONFIG_FILE_ENV = "TX_ENGINE_CONFIG_FILE"
STANDBY_ENV = "TX_ENGINE_STANDBY"  # set: import ahead, then read the config from stdin (embedded/__main__.py)
STANDBY_MODELS_ENV = "TX_ENGINE_STANDBY_MODELS"  # model dirs (os.pathsep-separated) whose classes to import



class EngineProcessConfig(BaseModel):
    """The fields every engine process has; each engine subclasses it with its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_dir: Path = Field(description="a local HF model directory (config, safetensors, tokenizer if any)")
    cluster_secret: str = Field(min_length=8, description="required in X-TX-Cluster-Secret on every route")
    host: str = Field(default="127.0.0.1", description="loopback or a private cluster address only")
    port: int = Field(default=0, ge=0, le=65535, description="0 = pick a free port")
    ready_file: Path | None = Field(default=None, description="written with the URL once the engine serves")
    max_adapters: int = Field(default=8, ge=0, description="most LoRA adapters loaded at once")
    exit_with_parent: bool = Field(default=True, description="exit when the parent process goes away")
    log_level: str = "info"

    def interpreter(self) -> str:
        """The Python that runs this engine's process: this one."""
        return sys.executable

    def to_env(self) -> dict[str, str]:
        """The environment entries that hand this config to a child process."""
        return {CONFIG_ENV: self.model_dump_json()}

    @classmethod
    def from_env(cls) -> Self:
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


__all__ = [
    "CONFIG_ENV", "CONFIG_FILE_ENV", "STANDBY_ENV", "STANDBY_MODELS_ENV", "EngineProcessConfig", "read_ready_file",
    "write_ready_file",
]
