"""The vLLM engine's configuration, passed to its process as JSON (like `EmbeddedEngineConfig`).

The parent sets `TX_ENGINE_CONFIG` (or `TX_ENGINE_CONFIG_FILE`) and runs `python -m tx.inference.engines.vllm`;
once vLLM is healthy and tx's routes serve, the process writes `{"url", "pid"}` to `ready_file`
(`tx.inference.engines.config.read_ready_file` reads it back). The fields and helpers every engine shares live
in `tx.inference.engines.config`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from tx.inference.engines.config import EngineProcessConfig
from tx.inference.engines.vllm import vllm_python

WORKER_EXTENSION = "tx.inference.engines.vllm.worker.TxWorkerExtension"
UNIX_SCHEME = "unix://"
WHY_UNIX = (
    "tx's worker extension runs in vLLM's dev mode, whose routes (/collective_rpc: load weights from any "
    "directory, join any transfer group, write adapter files) vLLM's --api-key does not cover; on a TCP port "
    "any local user could call them, so an attached vLLM must listen on a Unix socket (vllm serve --uds) in a "
    "directory only its owner may enter"
)


class VllmEngineConfig(EngineProcessConfig):
    """Everything one vLLM engine process needs."""

    # the base's fields, re-declared for this engine's description and bound (vLLM needs at least one adapter)
    model_dir: Path = Field(description="a local HF model directory (config, safetensors, tokenizer)")
    max_adapters: int = Field(default=8, ge=1, description="most LoRA adapters registered at once")
    max_gpu_adapters: int = Field(default=4, ge=1, description="vLLM --max-loras: adapters in one batch")
    max_lora_rank: int = Field(default=32, ge=1, description="vLLM --max-lora-rank")
    dtype: str = Field(
        default="float32", description="vLLM --dtype; float32 matches the trainer (vLLM's `auto` downcasts to bf16)"
    )
    max_model_len: int | None = Field(default=None, ge=1, description="vLLM --max-model-len")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    enable_sleep_mode: bool | None = Field(
        default=None, description="vLLM sleep mode; default: on with a CUDA GPU (CPU builds have none)"
    )
    enable_lora: bool = Field(
        default=True, description="vLLM --enable-lora; off for a model vLLM has no LoRA for (e.g. Aria)"
    )
    max_images_per_prompt: int = Field(
        default=4, ge=1, description="vLLM --limit-mm-per-prompt for images (vision-language models only)"
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
    vllm_url: str | None = Field(
        default=None, description="serve over a vLLM someone else started on this machine, on a Unix socket: "
        "unix:///path/to/vllm.sock, in a directory only its owner may enter (adapters go to it as files); "
        "instead of starting one. It must run with the flags `tx engine serve --print-vllm-command` prints"
    )
    vllm_python: str | None = Field(
        default=None, description="the Python of the vLLM environment, which runs this engine's process (tx "
        "installed beside vLLM there); default: the checkout's .venv-vllm, else the launcher's Python"
    )
    startup_timeout_s: float = Field(default=600.0, gt=0, description="how long vLLM may take to be healthy")
    rpc_timeout_s: float = Field(default=300.0, gt=0, description="bound on one worker call (weight update)")

    def interpreter(self) -> str:
        """The vLLM environment's Python (`tx.inference.engines.vllm.vllm_python`)."""
        return vllm_python(self.vllm_python)

    @field_validator("vllm_url")
    @classmethod
    def _attached_over_a_unix_socket(cls, url: str | None) -> str | None:
        if url is not None and not (url.startswith(UNIX_SCHEME) and url[len(UNIX_SCHEME):].startswith("/")):
            raise ValueError(f"--vllm-url must be unix:///absolute/path/to/vllm.sock, not {url!r}: {WHY_UNIX}")
        return url


def attached_socket(url: str) -> Path:
    """The socket path of a `unix:///...` vllm_url."""
    return Path(url[len(UNIX_SCHEME):])
