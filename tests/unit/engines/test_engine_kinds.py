"""The engine kinds (`engines/kinds.py`) and how every launcher runs one (`tx/inference/launch/process.py`,
`LocalLauncher`), without starting a real engine: each test's child is a tiny process."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tx.inference.engines.config import EngineProcessConfig
from tx.inference.engines.embedded.config import EmbeddedEngineConfig
from tx.inference.engines.kinds import EMBEDDED, ENGINE_KINDS, VLLM, engine_kind
from tx.inference.launch import LocalLauncher
from tx.inference.launch.process import run_config, start_logged, stop

SECRET = "kinds-test-secret"


def test_every_kind_names_a_runnable_module_and_its_config():
    assert set(ENGINE_KINDS) == {"embedded", "vllm"}
    for kind in ENGINE_KINDS.values():
        assert engine_kind(kind.name) is kind
        assert issubclass(kind.config, EngineProcessConfig)
        assert importlib.util.find_spec(f"{kind.module}.__main__") is not None, kind.module
    with pytest.raises(ValueError, match="embedded or vllm"):
        engine_kind("sglang")


def test_reading_the_kinds_imports_no_engine():
    code = ("import sys, tx.inference.launch, tx.inference.engines.kinds; "
            "print([m for m in ('torch', 'vllm', 'fastapi', 'ray') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_run_config_fills_what_each_kind_takes(tmp_path: Path):
    embedded = run_config(EMBEDDED, tmp_path, 120.0, model_dir=tmp_path, cluster_secret=SECRET,
                          max_adapters=3)
    assert isinstance(embedded, EmbeddedEngineConfig)
    assert embedded.ready_file == tmp_path / "ready.json" and embedded.max_adapters == 3
    assert embedded.stash_dir == tmp_path / "stash"
    assert stat.S_IMODE(os.stat(tmp_path / "stash").st_mode) == 0o700  # slept weights stay private
    vllm = run_config(VLLM, tmp_path / "v", 120.0, model_dir=tmp_path, cluster_secret=SECRET)
    assert vllm.model_dump()["startup_timeout_s"] == 120.0  # vLLM bounds its own start, before the launcher
    assert not (tmp_path / "v").exists()  # no stash: vLLM has no sleep to disk


def test_stop_ends_the_engines_whole_process_group():
    process = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE,
                               start_new_session=True, text=True)
    assert process.stdout is not None
    grandchild = int(process.stdout.readline())
    stop(process, timeout_s=0.5)
    assert process.returncode is not None
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped by init) is gone too
        return f.read().split()[2] != "Z"


def _broken(kind=EMBEDDED):
    """`kind`, run from a module that does not exist: its process exits at once with an ImportError."""
    return dataclasses.replace(kind, label="broken engine", module="tx.no_such_engine")


def test_an_engine_that_dies_at_start_fails_with_its_log(tmp_path: Path):
    config = run_config(EMBEDDED, tmp_path, 10.0, model_dir=tmp_path, cluster_secret=SECRET)
    with pytest.raises(RuntimeError, match=r"(?s)broken engine process exited .*No module named"):
        start_logged(_broken(), config, tmp_path / "engine.log", timeout_s=30)


def test_local_launcher_names_the_engine_that_failed(tmp_path: Path):
    launcher = LocalLauncher(tmp_path, SECRET, kind=_broken(), device="cpu")
    with pytest.raises(RuntimeError, match="broken engine e1 failed to start"):
        asyncio.run(launcher.start("e1", tmp_path))
    (run_dir,) = tmp_path.glob("e1-*")
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700 and (run_dir / "engine.log").exists()


def test_a_kind_that_cannot_run_here_fails_when_the_launcher_is_built(tmp_path: Path):
    def missing(fields: dict) -> None:
        raise RuntimeError("install the extra")

    with pytest.raises(RuntimeError, match="install the extra"):
        LocalLauncher(tmp_path, SECRET, kind=dataclasses.replace(VLLM, check=missing))


def test_closing_the_launcher_stops_an_engine_still_starting(tmp_path: Path, monkeypatch):
    """Regression: an engine mid-start at shutdown was left running (its own session outlives the server)."""
    pid_file = tmp_path / "engine.pid"
    (tmp_path / "hanging_engine").mkdir()
    (tmp_path / "hanging_engine" / "__main__.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    kind = dataclasses.replace(EMBEDDED, label="hanging engine", module="hanging_engine")
    launcher = LocalLauncher(tmp_path / "runs", SECRET, kind=kind, device="cpu", startup_timeout_s=60)

    async def scenario() -> None:
        start = asyncio.create_task(launcher.start("e1", tmp_path))
        while not pid_file.exists() or not pid_file.read_text():
            await asyncio.sleep(0.05)
        await launcher.close()
        with pytest.raises(RuntimeError, match="shut down while hanging engine e1 started"):
            await asyncio.wait_for(start, 10)
        with pytest.raises(RuntimeError, match="shutting down"):
            await launcher.start("e2", tmp_path)

    try:
        asyncio.run(scenario())
    finally:
        pid = int(pid_file.read_text())
        alive = _alive(pid)
        if alive:
            os.kill(pid, 9)
    assert not alive
