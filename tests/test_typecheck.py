"""The type checker over tx/: basedpyright (pinned in the dev extra; it bundles its own Node.js, so it
runs offline) in basic mode, configured in pyproject.toml. It must report no error at all: there is no
baseline of tolerated ones (basedpyright would read `.basedpyright/baseline.json` on its own, so that file
must not exist). A third-party stub that is wrong gets a `# pyright: ignore[rule]` with its reason on the
line, never a rule turned off; pyproject.toml makes a bare `# type: ignore` hide nothing and flags an ignore
without a rule or one that no longer hides an error.

The check (~40 s of one core) starts niced as soon as this test is collected (tests/background.py) and the test
waits for its result.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import background
import pytest

ROOT = Path(__file__).resolve().parent.parent


def typecheck(directory: Path) -> background.Job:
    """basedpyright over the project, reading no baseline (`none.json` is never written, even if one appears)."""
    checker = shutil.which("basedpyright", path=str(Path(sys.executable).parent))
    if checker is None:
        missing = "raise SystemExit('basedpyright is not installed: pip install -e .[dev]')"
        return background.Job([sys.executable, "-c", missing])
    return background.Job([checker, "--project", str(ROOT / "pyproject.toml"), "--pythonpath", sys.executable,
                           "--baselinefile", str(directory / "none.json")], cwd=ROOT, timeout_s=900)


BACKGROUND_JOBS = {"typecheck": typecheck}


def test_no_baseline_of_tolerated_errors() -> None:
    baseline = ROOT / ".basedpyright" / "baseline.json"
    assert not baseline.exists(), f"{baseline} would hide type errors: fix them instead"


@pytest.mark.slow
def test_tx_type_checks_clean() -> None:
    run = background.result("typecheck")
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert "0 errors" in run.stdout, run.stdout[-8000:]
    assert not (run.directory / "none.json").exists()
