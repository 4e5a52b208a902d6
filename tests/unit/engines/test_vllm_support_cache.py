"""vLLM's answers about architectures are kept per installation (`engines/vllm/support_cache.py`): reused only
under the same installation key, asked again otherwise, and a failed inspection is never kept. The child that
asks vLLM is replaced by a recorder here (named `asked`): what is tested is what tx keeps and reuses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tx.inference.engines.vllm import support, support_cache

QWEN = {"platform": "cpu", "lora": True}


@pytest.fixture
def asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The architectures each (recorded, not real) vLLM child was asked about; the cache in tmp_path; this
    Python as the vLLM environment's."""
    monkeypatch.setenv("TX_VLLM_SUPPORT_CACHE", str(tmp_path / "cache" / "vllm-support.json"))
    monkeypatch.setattr(support_cache, "vllm_python", lambda python=None: sys.executable)
    calls: list[tuple[str, ...]] = []

    def ask(architectures: tuple[str, ...], python: str | None) -> dict[str, dict] | str:
        calls.append(architectures)
        return {architecture: QWEN if architecture == "Qwen3ForCausalLM" else {"error": "unknown"}
                for architecture in architectures}

    monkeypatch.setattr(support, "_ask_vllm", ask)
    support.inspect.cache_clear()
    yield calls
    support.inspect.cache_clear()


def test_a_second_start_on_the_same_installation_does_not_ask_vllm(asked: list[tuple[str, ...]]) -> None:
    assert support.inspect(("Qwen3ForCausalLM",)) == {"Qwen3ForCausalLM": QWEN}
    support.inspect.cache_clear()  # as a new tx process
    assert support.inspect(("Qwen3ForCausalLM",)) == {"Qwen3ForCausalLM": QWEN}
    assert support.inspect(("Odd", "Qwen3ForCausalLM")) == {"Odd": {"error": "unknown"}, "Qwen3ForCausalLM": QWEN}
    assert asked == [("Qwen3ForCausalLM",), ("Odd",)]  # only what was not kept yet


def test_another_installation_or_platform_asks_again(asked: list[tuple[str, ...]],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    support.inspect(("Qwen3ForCausalLM",))
    support.inspect.cache_clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # may give vLLM another platform
    support.inspect(("Qwen3ForCausalLM",))
    support.inspect.cache_clear()
    monkeypatch.setattr(support_cache, "installation_key", lambda python=None: "another vLLM")
    support.inspect(("Qwen3ForCausalLM",))
    assert asked == [("Qwen3ForCausalLM",)] * 3


def test_a_failed_inspection_is_not_kept(asked: list[tuple[str, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(support, "_ask_vllm", lambda architectures, python: "vLLM's inspection failed: boom")
    assert support.inspect(("Qwen3ForCausalLM",)) == {"Qwen3ForCausalLM": {"error": "vLLM's inspection failed: boom"}}
    assert support_cache.load(support_cache.key_here()) == {}


def test_an_unreadable_cache_is_ignored_and_the_cache_can_be_turned_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "vllm-support.json"
    broken.write_text("{not json")
    monkeypatch.setenv("TX_VLLM_SUPPORT_CACHE", str(broken))
    assert support_cache.load("key") == {}
    support_cache.save("key", {"Qwen3ForCausalLM": QWEN})
    assert support_cache.load("key") == {"Qwen3ForCausalLM": QWEN}
    monkeypatch.setenv("TX_VLLM_SUPPORT_CACHE", "")
    assert support_cache.cache_path() is None and support_cache.load("key") == {}


def test_a_reinstalled_distribution_changes_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    info = site / "fakevllm-0.32.0.dist-info"  # a distribution made here: the same version installed twice
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakevllm\nVersion: 0.32.0\n")
    monkeypatch.syspath_prepend(str(site))
    first = support_cache.key_here()
    os.utime(info, ns=(1, 1))
    assert support_cache.key_here() != first
