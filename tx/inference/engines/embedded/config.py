"""The embedded engine's configuration, passed to its process as JSON (never as argv flags).

The parent sets `TX_ENGINE_CONFIG` (the JSON itself) or `TX_ENGINE_CONFIG_FILE` (a path to it) and runs
`python -m tx.inference.engines.embedded`. Once the engine serves, it writes `{"url": ..., "pid": ...}` to
`ready_file` (atomically), which `read_ready_file` reads back. The fields and helpers every engine shares live
in `tx.inference.engines.config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from tx.config.names import AttnImplementation, Dtype
from tx.inference.engines.config import (
    CONFIG_ENV,
    CONFIG_FILE_ENV,
    EngineProcessConfig,
    read_ready_file,
    write_ready_file,
)


class EmbeddedEngineConfig(EngineProcessConfig):
    """Everything one embedded engine process needs."""

    max_batch_size: int = Field(default=32, ge=1, description="most sequences (rows) decoded together")
    batch_wait_s: float = Field(default=0.005, ge=0, description="gather window: wait while requests keep arriving")
    batching: Literal["continuous", "static"] = Field(
        default="continuous",
        description="static: one adapter per batch and no request joins a running one (the engine before "
        "continuous batching, for benchmarks)",
    )
    num_threads: int | None = Field(default=None, ge=1, description="torch intra-op threads; default: all")
    stash_dir: Path | None = Field(default=None, description="where level-1 sleep stashes weights (private)")
    device: str = Field(default="auto", description="auto (cuda when available, else cpu), cpu, cuda, cuda:N")
    dtype: Dtype = Field(
        default="float32", description="base weights' (tx serve: the trainer's); LoRA and logprobs: float32"
    )
    attn_implementation: AttnImplementation | None = Field(
        default=None, description="forced attention; default: the best the family supports (as the trainer)"
    )


__all__ = ["CONFIG_ENV", "CONFIG_FILE_ENV", "EmbeddedEngineConfig", "read_ready_file", "write_ready_file"]
