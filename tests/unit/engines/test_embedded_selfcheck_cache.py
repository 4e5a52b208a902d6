"""The self-check's decisions are kept (`selfcheck_cache.py`): an engine loading the same model, code and versions
again reuses the decision, the model switched to the attention it chose, and runs no check; another model, another
dtype or a cache it cannot read runs the check again."""

from __future__ import annotations

from pathlib import Path

import pytest
from families import FAMILIES

from tx.inference.engines.embedded import selfcheck_cache
from tx.inference.engines.embedded.weights import Weights
from tx.models import write_tiny_model


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache" / "engine-selfcheck.json"
    monkeypatch.setenv("TX_SELFCHECK_CACHE", str(path))
    return path


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models the check ran on (the real check, counted)."""
    ran: list[str] = []
    real = selfcheck_cache.check_serving

    def counted(model, *args, **kwargs):
        ran.append(str(model.name_or_path))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(selfcheck_cache, "check_serving", counted)
    return ran


def test_a_second_load_reuses_the_decision_and_runs_no_check(cache: Path, checks: list[str],
                                                            family_model_dirs) -> None:
    assert "glm_moe_dsa" in FAMILIES  # falls back to its own attention: the kept decision must switch it too
    model_dir = family_model_dirs["glm_moe_dsa"]
    first = Weights(model_dir, max_adapters=1)
    assert len(checks) == 1 and cache.is_file()
    again = Weights(model_dir, max_adapters=1)
    assert len(checks) == 1, "the kept decision was not used"
    assert again.serving == first.serving and again.serving.attention == "sdpa"
    assert str(again.model.config._attn_implementation) == "sdpa"  # pyright: ignore[reportOptionalMemberAccess]


def test_another_model_dtype_or_an_unreadable_cache_runs_the_check(cache: Path, checks: list[str],
                                                                   tmp_path: Path) -> None:
    one = write_tiny_model(tmp_path / "one", preset="tiny", seed=0)
    other = write_tiny_model(tmp_path / "other", preset="tiny", seed=1)  # same shapes, other weights
    Weights(one, max_adapters=1)
    Weights(other, max_adapters=1)
    Weights(one, max_adapters=1, dtype="bfloat16")
    assert len(checks) == 3
    Weights(one, max_adapters=1)
    assert len(checks) == 3
    cache.write_text("{not json")
    Weights(one, max_adapters=1)
    assert len(checks) == 4


def test_the_cache_is_off_when_named_empty(monkeypatch: pytest.MonkeyPatch, checks: list[str],
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("TX_SELFCHECK_CACHE", "")
    model_dir = write_tiny_model(tmp_path / "m", preset="tiny", seed=0)
    Weights(model_dir, max_adapters=1)
    Weights(model_dir, max_adapters=1)
    assert len(checks) == 2 and selfcheck_cache.cache_path() is None
