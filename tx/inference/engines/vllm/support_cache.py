"""vLLM's answers about architectures (`support.inspect`), kept per installation: asking costs a child ~10 s of
CPU importing vLLM's model code, and the answer changes only with what is installed.

An answer is reused only under the same key: the vLLM environment's Python (its prefix and version), every
distribution installed there (name, version, and when its metadata was written, so that a reinstall of the same
version counts as new), and the environment variables and devices that decide vLLM's platform (the key of a vLLM
environment other than this process's is made by its own Python, in a child). Anything else is a miss, and a
miss asks vLLM again: a stale cache never accepts a model. Only complete answers from vLLM are kept (never a timeout or a failed
child). The file is `$XDG_CACHE_HOME/tx/vllm-support.json` (`~/.cache/...`); `TX_VLLM_SUPPORT_CACHE` names another,
and an empty value turns the cache off. A cache that cannot be read or written is ignored.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

from tx.inference.engines.vllm import is_this_python, vllm_python

PLATFORM_ENV = ("VLLM_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "ROCM_", "ZE_", "TPU_", "NEURON_")
"""Environment variables whose names start so may change which platform vLLM finds (or what it registers)."""


def cache_path() -> Path | None:
    """Where the answers are kept; None when the cache is off (TX_VLLM_SUPPORT_CACHE set empty)."""
    named = os.environ.get("TX_VLLM_SUPPORT_CACHE")
    if named is not None:
        return Path(named) if named else None
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "tx" / "vllm-support.json"


def installation_key(python: str | None = None) -> str | None:
    """`key_here` of the vLLM environment (`vllm_python(python)`); None when its Python does not answer
    (nothing is kept then)."""
    python = vllm_python(python)
    if is_this_python(python):
        return key_here()
    code = "from tx.inference.engines.vllm.support_cache import key_here; print(key_here())"
    try:
        done = subprocess.run([python, "-P", "-c", code], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    return lines[-1] if done.returncode == 0 and lines else None


def key_here() -> str:
    """A digest of what vLLM's answers depend on: this Python, the installed distributions, the platform."""
    distributions = sorted(
        (dist.metadata["Name"] or "", dist.version, _written_ns(dist)) for dist in importlib.metadata.distributions())
    devices = sorted(name for name in _listdir("/dev") if name.startswith(("nvidia", "kfd", "dri", "accel")))
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith(PLATFORM_ENV))
    text = json.dumps([sys.prefix, sys.version, distributions, devices, environment])
    return hashlib.sha256(text.encode()).hexdigest()


def load(key: str) -> dict[str, dict]:
    """The answers kept under `key` (architecture -> answer); {} when there are none (or none readable)."""
    path = cache_path()
    if path is None:
        return {}
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(kept, dict) or kept.get("key") != key or not isinstance(kept.get("architectures"), dict):
        return {}
    return kept["architectures"]


def save(key: str, answers: dict[str, dict]) -> None:
    """Keep `answers` under `key` beside those already kept under it (those under another key are dropped)."""
    path = cache_path()
    if path is None:
        return
    merged = {**load(key), **answers}
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps({"key": key, "architectures": merged}))
        os.replace(temporary, path)  # whole, never half-written, for a tx starting beside this one
    except OSError:
        temporary.unlink(missing_ok=True)


def _written_ns(dist: importlib.metadata.Distribution) -> int:
    where = getattr(dist, "_path", None)  # the .dist-info / .egg-info directory of a path distribution
    try:
        return os.stat(where).st_mtime_ns if where is not None else 0
    except OSError:
        return 0


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
