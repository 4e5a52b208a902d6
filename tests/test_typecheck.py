"""The type checker over tx/: basedpyright (pinned in the dev extra; it bundles its own Node.js, so it
runs offline) in basic mode, configured in pyproject.toml. It must report no error at all: there is no
baseline of tolerated ones (basedpyright would read `.basedpyright/baseline.json` on its own, so that file
must not exist). A third-party stub that is wrong gets a `# pyright: ignore[rule]` with its reason on the
line, never a rule turned off; pyproject.toml makes a bare `# type: ignore` hide nothing and flags an ignore
without a rule or one that no longer hides an error.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_no_baseline_of_tolerated_errors() -> None:
    baseline = ROOT / ".basedpyright" / "baseline.json"
    assert not baseline.exists(), f"{baseline} would hide type errors: fix them instead"


@pytest.mark.slow
def test_tx_type_checks_clean(tmp_path: Path) -> None:
    checker = shutil.which("basedpyright", path=str(Path(sys.executable).parent))
    if checker is None:
        pytest.fail("basedpyright is not installed: pip install -e '.[dev]'")
    no_baseline = tmp_path / "none.json"  # never written: the check reads no baseline, even if one appears
    run = subprocess.run([checker, "--project", str(ROOT / "pyproject.toml"), "--pythonpath", sys.executable,
                          "--baselinefile", str(no_baseline)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert "0 errors" in run.stdout, run.stdout[-8000:]
    assert not no_baseline.exists()
