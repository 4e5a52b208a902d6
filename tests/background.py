"""One-shot subprocesses whose results tests assert on, started as soon as the run has collected those tests,
at the lowest CPU priority (nice 19).

Why: the suite mostly waits (on servers, engines, a child's imports) and leaves one of a 2-core box's cores
idle; a niced process takes only idle CPU, so a long one-shot check (the type checker, a `tx serve` that must
refuse to start) is done by the time its test runs, without slowing the tests in between. Only what a test
collected in this run needs is started (`pytest -k` starts nothing else); whatever is still running when the
run ends is killed.

A test module declares its jobs in `BACKGROUND_JOBS`: {key: factory}, where a factory takes a fresh directory
and returns the `Job` to run; its tests call `result(key)`, which waits for the job (starting it at once if the
run did not, e.g. when the module was imported some other way).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Job:
    cmd: list[str]
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    directory: Path  # the job's directory (removed at the end of the run): where its factory put files


@dataclass
class _Running:
    job: Job
    directory: Path
    proc: subprocess.Popen

    def wait(self) -> Finished:
        try:
            self.proc.wait(self.job.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(self.proc)
            raise AssertionError(f"{' '.join(self.job.cmd)} did not finish in {self.job.timeout_s:.0f} s") from None
        out, err = ((self.directory / name).read_text(errors="replace") for name in ("stdout", "stderr"))
        return Finished(self.proc.returncode, out, err, self.directory)


Factory = Callable[[Path], Job]
_FACTORIES: dict[str, Factory] = {}
_RUNNING: dict[str, _Running] = {}
_DONE: dict[str, Finished] = {}
_LEFT: list[Path] = []  # the finished jobs' directories, removed at the end of the run


def start(key: str, factory: Factory) -> None:
    """Start the job `factory` makes, once per run (niced, in its own session, output to files)."""
    _FACTORIES.setdefault(key, factory)
    if key in _RUNNING or key in _DONE:
        return
    directory = Path(tempfile.mkdtemp(prefix=f"tx-background-{key}-"))
    job = factory(directory)
    nice = shutil.which("nice")
    cmd = [nice, "-n", "19", *job.cmd] if nice else job.cmd
    with open(directory / "stdout", "wb") as out, open(directory / "stderr", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=job.cwd, env={**os.environ, **job.env}, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True)
    _RUNNING[key] = _Running(job, directory, proc)


def start_for(modules: Iterable[object]) -> None:
    """Start every job the given test modules declare in `BACKGROUND_JOBS`."""
    for module in modules:
        for key, factory in getattr(module, "BACKGROUND_JOBS", {}).items():
            start(key, factory)


def result(key: str, factory: Factory | None = None) -> Finished:
    """The finished job `key` (waited for; started now if it was not)."""
    if key in _DONE:
        return _DONE[key]
    if key not in _RUNNING:
        made = factory or _FACTORIES.get(key)
        assert made is not None, f"no background job {key!r}"
        start(key, made)
    running = _RUNNING.pop(key)
    _LEFT.append(running.directory)
    _DONE[key] = running.wait()
    return _DONE[key]


def stop_all() -> None:
    """Kill the jobs still running (their tests were not reached) and remove every job's directory."""
    for running in _RUNNING.values():
        _kill(running.proc)
        _LEFT.append(running.directory)
    _RUNNING.clear()
    for directory in _LEFT:
        shutil.rmtree(directory, ignore_errors=True)
    _LEFT.clear()


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait(10)
