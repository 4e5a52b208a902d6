"""What a run records of its base model (tx/models/fingerprint.py): the hub commit of a hub-cache snapshot, none
for a local directory."""

from __future__ import annotations

from pathlib import Path

from tx.models.fingerprint import hub_revision


def test_a_hub_snapshot_names_its_commit_and_a_local_directory_none(tmp_path: Path) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    assert hub_revision(snapshot) == commit
    assert hub_revision(tmp_path / "models" / "tiny-qwen3") is None
    branch_named = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "main"
    assert hub_revision(branch_named) is None  # only a commit is a revision that pins the weights
