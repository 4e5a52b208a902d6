"""The vLLM engine's configuration, passed to its process as JSON (like `EmbeddedEngineConfig`).

The parent sets `TX_ENGINE_CONFIG` (or `TX_ENGINE_CONFIG_FILE`) and runs `python -m tx.inference.engines.vllm`;
once vLLM is healthy and tx's routes serve, the process writes `{"url", "pid"}` to `ready_file`
(`tx.inference.engines.embedded.config.read_ready_file` reads it back).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tx.inference.engines.embedded.config import CONFIG_ENV, CONFIG_FILE_ENV

WORKER_EXTENSION = "tx.inference.engines.vllm.worker.TxWorkerExtension"


class VllmEngineConfig(BaseModel):
    """Everything one vLLM engine process needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_dir: Path = Field(description="a local HF model directory (config, safetensors, tokenizer)")
    cluster_secret: str = Field(min_length=8, description="required in X-TX-Cluster-Secret on every route")
    host: str = Field(default="127.0.0.1", description="loopback or a private cluster address only")
    port: int = Field(default=0, ge=0, le=65535, description="0 = pick a free port")
    ready_file: Path | None = Field(default=None, description="written with the URL once the engine serves")
    max_adapters: int = Field(default=8, ge=1, description="most LoRA adapters registered at once")
    max_gpu_adapters: int = Field(default=4, ge=1, description="vLLM --max-loras: adapters in one batch")
    max_lora_rank: int = Field(default=32, ge=1, description="vLLM --max-lora-rank")
    dtype: str = Field(default="auto", description="vLLM --dtype (float32 for exact parity on CPU)")
    max_model_len: int | None = Field(default=None, ge=1, description="vLLM --max-model-len")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    enable_sleep_mode: bool | None = Field(
        default=None, description="vLLM sleep mode; default: on with a CUDA GPU (CPU builds have none)"
    )
    cpu_kv_cache_gib: float = Field(default=1.0, gt=0, description="VLLM_CPU_KVCACHE_SPACE on CPU builds")
    extra_args: list[str] = Field(default_factory=list, description="more `vllm serve` flags, e.g. TP size")
    extra_env: dict[str, str] = Field(default_factory=dict, description="more environment for vLLM")
    run_dir: Path | None = Field(
        default=None, description="private dir for vLLM's socket; default: a temp dir"
    )
    lora_dir: Path | None = Field(
        default=None, description="private dir for adapter files; default: a temp dir in /dev/shm (memory)"
    )
    startup_timeout_s: float = Field(default=600.0, gt=0, description="how long vLLM may take to be healthy")
    rpc_timeout_s: float = Field(default=300.0, gt=0, description="bound on one worker call (weight update)")
    exit_with_parent: bool = Field(default=True, description="exit when the parent process goes away")
    log_level: str = "info"

    def to_env(self) -> dict[str, str]:
        """The environment entries that hand this config to a child process."""
        return {CONFIG_ENV: self.model_dump_json()}

    @classmethod
    def from_env(cls) -> VllmEngineConfig:
        if CONFIG_ENV in os.environ:
            return cls.model_validate_json(os.environ[CONFIG_ENV])
        if CONFIG_FILE_ENV in os.environ:
            return cls.model_validate_json(Path(os.environ[CONFIG_FILE_ENV]).read_text())
        raise ValueError(f"set {CONFIG_ENV} (JSON) or {CONFIG_FILE_ENV} (a path to JSON)")
