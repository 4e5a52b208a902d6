"""Weight versions (tx/inference/manager/versions.py): a deleted checkpoint's versions are dropped and the clients
pinned to them fail naming why (the shared-server probe's finding 6)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tx.inference.manager.versions import VersionStore
from tx.inference.protocol import LoraSpec
from tx.types import NotFoundError

SPEC = LoraSpec(r=4, lora_alpha=32, target_modules=["q_proj"])


def test_a_revoked_version_fails_its_clients_with_the_reason(tmp_path: Path) -> None:
    versions = VersionStore(keep=4)
    gone, kept = tmp_path / "gone", tmp_path / "kept"
    versions.add("run", gone, "tinker://r/sampler_weights/gone", [("a", torch.zeros(2))], SPEC)
    versions.add("run", kept, "tinker://r/sampler_weights/kept", [("a", torch.ones(2))], SPEC)
    versions.pin("theirs", gone, "tinker://r/sampler_weights/gone")
    versions.pin("mine", kept, "tinker://r/sampler_weights/kept")
    assert versions.revoke(gone, "tinker://r/sampler_weights/gone was deleted") == 1
    with pytest.raises(NotFoundError, match="gone was deleted"):
        versions.pinned("theirs", gone)
    assert versions.pinned("mine", kept).label.endswith("kept") and versions.latest(gone) is None
