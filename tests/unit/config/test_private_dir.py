"""`make_private_dir`: the data directory is 0700 (docs/security.md#the-data-directory)."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from tx.config import make_private_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_data_directory_is_made_0700(tmp_path: Path) -> None:
    made = tmp_path / "a" / ".tx"
    make_private_dir(made)
    assert mode(made) == 0o700


def test_an_open_one_of_this_users_is_tightened_with_a_log_line(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    opened = tmp_path / ".tx"
    opened.mkdir()
    opened.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="tx.config"):
        make_private_dir(opened)
    assert mode(opened) == 0o700
    assert "made 0700" in caplog.text


def test_a_private_one_is_left_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    private = tmp_path / ".tx"
    private.mkdir(mode=0o700)
    with caplog.at_level(logging.WARNING, logger="tx.config"):
        make_private_dir(private)
    assert mode(private) == 0o700 and not caplog.text
