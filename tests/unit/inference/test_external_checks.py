"""What tx checks of an engine it did not start: the model fingerprint, and each /health problem's message."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tx.config import Settings
from tx.inference.manager.external import health_problem
from tx.inference.protocol import CONTRACT_VERSION
from tx.models.fingerprint import model_fingerprint
from tx.models.tiny import write_tiny_text_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_text_model(tmp_path_factory.mktemp("fp") / "a", preset="tiny", seed=0)


def test_fingerprint_is_the_same_for_a_copy_and_differs_for_other_weights(tiny: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(tiny, tmp_path / "copy"))
    other = write_tiny_text_model(tmp_path / "other", preset="tiny", seed=1)
    assert model_fingerprint(copy) == model_fingerprint(tiny)
    assert model_fingerprint(other) != model_fingerprint(tiny)


def test_fingerprint_ignores_provenance_keys_of_the_config(tiny: Path, tmp_path: Path) -> None:
    import json

    copy = Path(shutil.copytree(tiny, tmp_path / "copy"))
    config = json.loads((copy / "config.json").read_text())
    config.update(_name_or_path="/somewhere/else", transformers_version="0.0.1")
    (copy / "config.json").write_text(json.dumps(config))
    assert model_fingerprint(copy) == model_fingerprint(tiny)
    config["num_hidden_layers"] += 1
    (copy / "config.json").write_text(json.dumps(config))
    assert model_fingerprint(copy) != model_fingerprint(tiny)


def health(**fields) -> dict:
    return {"model": "/m", "contract_version": CONTRACT_VERSION, "model_fingerprint": "sha256:a",
            "weight_transports": ["gloo"], **fields}


@pytest.mark.parametrize("fields, problem", [
    ({}, None),
    ({"contract_version": None}, "contract none (older than version 1)"),
    ({"contract_version": CONTRACT_VERSION + 1}, f"contract version {CONTRACT_VERSION + 1}"),
    ({"model_fingerprint": "sha256:b"}, "none of the base models this server serves: base (sha256:a)"),
    ({"weight_transports": ["ipc"]}, "takes no weight transport"),
    ({"max_adapters": 2}, "holds at most 2 weight versions and tx keeps 4"),
    ({"max_adapters": 4}, None),
])
def test_health_problems(fields: dict, problem: str | None) -> None:
    body = health(**fields)
    if fields.get("contract_version", 0) is None:
        del body["contract_version"]
    model, found = health_problem(body, {"base": "sha256:a"}, max_adapters=4)
    if problem is None:
        assert (model, found) == ("base", None)
    else:
        assert model is None and problem in found


def test_engine_urls_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TX_ENGINE_URLS", "http://10.0.0.2:8001/, http://10.0.0.3:8001")
    monkeypatch.setenv("TX_ENGINE_SECRET", "s" * 16)
    settings = Settings()
    assert settings.engines.urls == ["http://10.0.0.2:8001", "http://10.0.0.3:8001"]
    assert "s" * 16 not in repr(settings)
    assert settings.engines.managed_count(has_external=True) == 0
    assert settings.engines.managed_count(has_external=False) == 1
    monkeypatch.setenv("TX_ENGINE_URLS", '["http://10.0.0.4:8001"]')
    assert Settings().engines.urls == ["http://10.0.0.4:8001"]


def test_engine_urls_need_a_secret_and_a_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TX_ENGINE_SECRET", raising=False)
    with pytest.raises(ValueError, match="cluster secret"):
        Settings(engine_urls=["http://10.0.0.2:8001"])
    with pytest.raises(ValueError, match="http://"):
        Settings(engine_urls=["10.0.0.2:8001"], engine_secret="s" * 16)
    with pytest.raises(ValueError, match="nothing to sample from"):
        Settings(engine_count=0)


def test_routing_skips_down_external_engines_and_names_them_when_none_is_left() -> None:
    from tx.inference.manager.external import ExternalEngine
    from tx.inference.manager.groups import EngineSettings, build_groups

    externals = [ExternalEngine(f"http://10.0.0.{i}:8001", "base", "sha256:a") for i in (2, 3)]
    (group,) = build_groups({"base": Path("/m")}, EngineSettings(count=1, count_with_external=0), externals).values()
    assert sorted(group.slots) == ["x0", "x1"] and all(s.external for s in group.slots.values())
    home = group.pick("session-1")
    group.slots[home].process.up = False
    group.slots[home].process.problem = "connection refused"
    other = group.pick("session-1")
    assert other != home  # the session moves to the engine that is up
    with pytest.raises(RuntimeError, match="no engine of base can sample now .*10.0.0.* connection refused"):
        group.pick("session-1", {other})
