"""CheckpointFiles: atomic writes, and the startup sweep of what a crashed write left behind."""

from __future__ import annotations

from pathlib import Path

from tx.core.checkpoints.files import CheckpointFiles, TinkerPath

PATH = TinkerPath("run1", "weights", "step-1")


def _write(files: CheckpointFiles, text: str) -> None:
    files.write(PATH, lambda d: (d / "w.txt").write_text(text), overwrite=True)


def test_sweep_removes_temporaries_and_stale_old_copies(tmp_path: Path) -> None:
    files = CheckpointFiles(tmp_path)
    _write(files, "new")
    parent = files.directory(PATH).parent
    (parent / ".tmp-step-1-0123abcd").mkdir()  # killed while writing
    (parent / ".old-step-1-89abcdef").mkdir()  # killed after the new copy was moved in
    (parent / "step-2").mkdir()  # a real checkpoint is left alone
    assert files.sweep() == 2
    assert sorted(p.name for p in parent.iterdir()) == ["step-1", "step-2"]
    assert (files.directory(PATH) / "w.txt").read_text() == "new"


def test_sweep_puts_back_an_old_copy_whose_replacement_never_arrived(tmp_path: Path) -> None:
    """Killed between the two renames: the listed checkpoint must still load, so the old copy returns."""
    files = CheckpointFiles(tmp_path)
    _write(files, "old")
    final = files.directory(PATH)
    final.rename(final.parent / ".old-step-1-0000aaaa")
    (final.parent / ".tmp-step-1-1111bbbb").mkdir()
    assert files.sweep() == 2
    assert (final / "w.txt").read_text() == "old"
    assert [p.name for p in final.parent.iterdir()] == ["step-1"]


def test_sweep_of_an_empty_root(tmp_path: Path) -> None:
    assert CheckpointFiles(tmp_path / "none").sweep() == 0
