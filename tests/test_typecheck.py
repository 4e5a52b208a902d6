"""The type checker over tx/: basedpyright (pinned in the dev extra; it bundles its own Node.js, so it
runs offline) in basic mode, configured in pyproject.toml. It must report nothing new.

Errors that predate the checker are listed in .basedpyright/baseline.json (matched per file, rule and
column span, so moved lines still match); fixing one drops it from the list with
`basedpyright --writebaseline`. Anything else fails this test, so new code is checked in full.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_tx_type_checks_clean(tmp_path: Path) -> None:
    checker = shutil.which("basedpyright", path=str(Path(sys.executable).parent))
    if checker is None:
        pytest.fail("basedpyright is not installed: pip install -e '.[dev]'")
    baseline = tmp_path / "baseline.json"  # a copy: basedpyright rewrites its baseline when errors go away
    shutil.copy(ROOT / ".basedpyright" / "baseline.json", baseline)
    run = subprocess.run([checker, "--project", str(ROOT / "pyproject.toml"), "--pythonpath", sys.executable,
                          "--baselinefile", str(baseline)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
