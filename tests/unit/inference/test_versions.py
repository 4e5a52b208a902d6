"""Weight versions (tx/inference/manager/versions.py): snapshot pins stay; an inflight client follows its run's
inflight target, which shares one adapter name across saves and is held whatever `keep` says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tx.inference.manager.versions import VersionStore
from tx.inference.protocol import LoraSpec
from tx.types import UserError

SPEC = LoraSpec(r=4, lora_alpha=8, target_modules=["q_proj"])


def save(store: VersionStore, tmp_path: Path, name: str, inflight: bool = False):
    return store.add("run", tmp_path / name, name, [("w", torch.zeros(1))], SPEC, inflight)


def test_inflight_clients_follow_the_target_and_snapshots_stay(tmp_path: Path) -> None:
    store = VersionStore(keep=2)
    first = save(store, tmp_path, "a", inflight=True)
    store.follow("inflight-client", "run")
    snapshot = save(store, tmp_path, "b")
    store.pin("snapshot-client", tmp_path / "b", "b")
    second = save(store, tmp_path, "c", inflight=True)
    assert first.adapter == second.adapter == "inflight1" and snapshot.adapter == f"v{snapshot.number}"
    assert store.pinned("inflight-client", tmp_path / "a") is second  # follows the newest inflight save
    assert store.pinned("snapshot-client", tmp_path / "b") is snapshot
    for name in ("d", "e", "f"):  # more snapshot saves than `keep`: the inflight target stays held
        save(store, tmp_path, name)
    assert store.pinned("inflight-client", tmp_path / "a") is second
    with pytest.raises(UserError, match="no longer held"):
        store.pinned("snapshot-client", tmp_path / "b")


def test_each_inflight_session_gets_its_own_prefix_cache_namespace(tmp_path: Path) -> None:
    from tx.inference.manager.facade import cache_namespace
    from tx.types import SampleKey

    store = VersionStore(keep=2)
    inflight, snapshot = save(store, tmp_path, "a", inflight=True), save(store, tmp_path, "b")
    first, second = (cache_namespace(SampleKey(f"s:sample:{n}", 1), inflight) for n in (1, 2))
    assert first and second and first != second and len(first) == 32
    assert cache_namespace(SampleKey("s:sample:1", 2), inflight) == first  # one namespace per session
    assert cache_namespace(SampleKey("s:sample:1", 1), snapshot) is None  # the shared cache
    assert cache_namespace(SampleKey("s:sample:1", 1), None) is None
