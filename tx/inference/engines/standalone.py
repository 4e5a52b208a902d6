"""`tx engine serve`: one engine started by hand, on any machine, for a `tx serve --engine-url` elsewhere.

It serves the same contract as the engines tx starts itself (`tx/inference/protocol/`), in the foreground
(the kind's module, `engines/kinds.py`, run in this process), until SIGTERM or Ctrl-C; it does not exit when
its parent goes away. The cluster secret comes from the
environment (`TX_ENGINE_SECRET`), never from argv, so it does not show in `ps`. The embedded engine runs in
this process; the vLLM engine runs `vllm serve` as a child on a private socket, with tx's worker extension
(`tx/inference/engines/vllm/child.py` builds that command line).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from tx.config.names import Dtype, EngineKindName
    from tx.inference.engines.config import EngineProcessConfig
    from tx.inference.engines.embedded.config import EmbeddedEngineConfig
    from tx.inference.engines.vllm.config import VllmEngineConfig

SECRET_ENV = "TX_ENGINE_SECRET"
DEFAULT_VLLM_SOCKET = Path.home() / ".tx" / "vllm" / "vllm.sock"  # --print-vllm-command without --vllm-url
MIN_SECRET_CHARS = 8


class StandaloneError(ValueError):
    """A bad `tx engine serve` invocation (the message says what to change)."""


@dataclass(frozen=True)
class StandaloneEngine:
    """What `tx engine serve` was asked for."""

    kind: EngineKindName
    model: str  # a local directory or a hub id in the HF cache
    host: str = "127.0.0.1"
    port: int = 8001
    ready_file: Path | None = None
    max_adapters: int = 8
    device: str = "auto"  # embedded only
    dtype: Dtype = "float32"
    tensor_parallel_size: int = 1  # vLLM only
    max_model_len: int | None = None  # vLLM only
    max_lora_rank: int = 32  # vLLM only: its --max-lora-rank (the largest LoRA rank the engine takes)
    vllm_url: str | None = None  # vLLM only: serve over a vLLM the user started on this machine (unix:///...)
    vllm_python: str | None = None  # vLLM only: the vLLM environment's Python, which runs the engine
    extra_vllm_args: list[str] = field(default_factory=list)

    def config(self, secret: str) -> EngineProcessConfig:
        """The config of the engine of `kind`."""
        return self.vllm_config(secret) if self.kind == "vllm" else self.embedded_config(secret)

    def embedded_config(self, secret: str) -> EmbeddedEngineConfig:
        """The embedded engine's config (the model resolved to its directory)."""
        from tx.inference.engines.embedded.config import EmbeddedEngineConfig

        return EmbeddedEngineConfig(**self._common(secret), device=self.device, dtype=self.dtype)

    def vllm_config(self, secret: str) -> VllmEngineConfig:
        """The vLLM engine's config (the model resolved to its directory)."""
        from tx.inference.engines.vllm.config import VllmEngineConfig

        tp = ["--tensor-parallel-size", str(self.tensor_parallel_size)] if self.tensor_parallel_size > 1 else []
        return VllmEngineConfig(**self._common(secret), dtype=self.dtype, max_model_len=self.max_model_len,
                                max_lora_rank=self.max_lora_rank, extra_args=tp + list(self.extra_vllm_args),
                                vllm_url=self.vllm_url, vllm_python=self.vllm_python)

    def _common(self, secret: str) -> _CommonFields:
        from tx.models.resolve import resolve_model_dir

        return _CommonFields(model_dir=resolve_model_dir(self.model), cluster_secret=secret, host=self.host,
                             port=self.port, ready_file=self.ready_file, max_adapters=self.max_adapters,
                             exit_with_parent=False)


class _CommonFields(TypedDict):
    """The `EngineProcessConfig` fields both kinds of engine get from `tx engine serve`."""

    model_dir: Path
    cluster_secret: str
    host: str
    port: int
    ready_file: Path | None
    max_adapters: int
    exit_with_parent: bool


def secret_from_env() -> str:
    secret = os.environ.get(SECRET_ENV, "")
    if len(secret) < MIN_SECRET_CHARS:
        raise StandaloneError(
            f"set {SECRET_ENV} to the cluster secret (at least {MIN_SECRET_CHARS} characters; the same value "
            "tx serve gets as --engine-secret / TX_ENGINE_SECRET). It is read from the environment only, so it "
            "never shows in ps."
        )
    return secret


def vllm_serve_command(engine: StandaloneEngine, secret_hint: str = "...") -> str:
    """The shell lines that start vLLM with everything tx's engine needs (the worker extension, dev mode, runtime
    LoRA, raw logprobs, ...) on a Unix socket in a private directory, then `tx engine serve` over it on this
    machine. vLLM listens on no TCP port: its dev-mode routes reach tx's worker extension, and its --api-key
    does not cover them (`WHY_UNIX`)."""
    import shlex

    from tx.inference.engines.vllm.child import VllmChild, sleep_mode_on
    from tx.inference.engines.vllm.config import UNIX_SCHEME, attached_socket
    from tx.inference.engines.vllm.server import BASE_MODEL_NAME

    config = engine.vllm_config("unused-secret")
    socket = attached_socket(engine.vllm_url) if engine.vllm_url else DEFAULT_VLLM_SOCKET
    child = VllmChild(config, Path("."), BASE_MODEL_NAME, sleep_mode_on(config))
    env = child.environment()
    words = [f"{k}={env[k]}" for k in ("VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING")]
    words += [config.interpreter(), "-P", "-m", "vllm.entrypoints.openai.api_server",  # the vLLM env's
              "--model", str(config.model_dir), "--uds", str(socket), *child.flags()]
    vllm = " ".join(shlex.quote(w) if "=" not in w or w.startswith("-") else w for w in words)
    tx = ["tx", "engine", "serve", "--kind", "vllm", "--model", engine.model, "--vllm-url",
          f"{UNIX_SCHEME}{socket}", "--host", engine.host, "--port", str(engine.port),
          "--max-adapters", str(engine.max_adapters), "--max-lora-rank", str(engine.max_lora_rank)]  # as vLLM's
    return "\n".join([
        f"mkdir -p -m 700 {shlex.quote(str(socket.parent))}",
        f"{vllm} &",
        f"{SECRET_ENV}={secret_hint} " + " ".join(shlex.quote(w) for w in tx),
    ])


def serve(engine: StandaloneEngine) -> None:
    """Run the engine in the foreground until it is stopped: in this process, or, where its config names
    another Python (the vLLM environment's), as that Python's process in place of this one."""
    from tx.inference.engines.kinds import engine_kind
    from tx.inference.engines.vllm import is_this_python

    config, module = engine.config(secret_from_env()), engine_kind(engine.kind).module
    python = config.interpreter()
    if not is_this_python(python):
        try:
            os.execve(python, [python, "-P", "-m", module], {**os.environ, **config.to_env()})
        except OSError as exc:
            raise StandaloneError(f"the vLLM environment's Python {python} does not run: {exc}") from None
    importlib.import_module(f"{module}.__main__").main(config)


__all__ = ["SECRET_ENV", "StandaloneEngine", "StandaloneError", "secret_from_env", "serve", "vllm_serve_command"]
