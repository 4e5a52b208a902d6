"""The Host check against DNS rebinding (tx/api/hosts.py), in-process: which names a server answers for
each way it binds, and the 421 the others get."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tx.api.app import create_app
from tx.api.hosts import allowed_host_names, host_name
from tx.config import Settings


@pytest.mark.parametrize(("header", "name"), [
    ("localhost:8000", "localhost"), ("LocalHost.", "localhost"), ("127.0.0.1", "127.0.0.1"),
    ("[::1]:8000", "::1"), ("[::1]", "::1"), ("gpu-box.lan:443", "gpu-box.lan"), ("", ""),
])
def test_a_host_header_is_read_without_port_brackets_or_case(header: str, name: str) -> None:
    assert host_name(header) == name


def test_a_loopback_server_answers_loopback_names_its_public_url_and_the_allowed(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, allowed_hosts=["Box.Lan"], public_url="https://tx.example:9000/")
    assert allowed_host_names(settings) == {"localhost", "127.0.0.1", "::1", "box.lan", "tx.example"}


def test_a_server_bound_elsewhere_checks_only_when_names_are_given(tmp_path: Path) -> None:
    keyed = {"data_dir": tmp_path, "api_keys": ["tml-a"], "host": "0.0.0.0"}
    assert allowed_host_names(Settings(**keyed)) is None
    assert "gpu-box.lan" in allowed_host_names(Settings(**keyed, allowed_hosts=["gpu-box.lan"]))
    assert allowed_host_names(Settings(data_dir=tmp_path, allowed_hosts=["*"])) is None


def test_a_rebound_name_gets_a_421_that_names_the_flag_and_healthz_answers_any(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, allowed_hosts=["box.lan"]))
    with TestClient(app, base_url="http://rebind.evil.example:8000") as client:  # engines start lazily
        key = {"X-API-Key": "tml-local"}
        refused = client.get("/api/v1/training_runs", headers=key)
        assert refused.status_code == 421, refused.text
        assert "--allowed-host" in refused.json()["detail"] and "rebind.evil.example" in refused.json()["detail"]
        assert client.get("/api/v1/healthz").status_code == 200
        for name in ("localhost:8000", "127.0.0.1", "[::1]:8000", "box.lan:8000"):
            answer = client.get("/api/v1/training_runs", headers={**key, "Host": name})
            assert answer.status_code == 200, (name, answer.text)
