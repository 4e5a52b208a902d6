"""/metrics in-process (FastAPI TestClient, no engines started): operator keys, per-route counts, and
two apps in one process keeping their own registries."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tx.api.app import create_app
from tx.config import Settings


def _app(tmp_path: Path, **settings) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(data_dir=tmp_path, **settings)), base_url="http://localhost") as client:
        yield client


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[TestClient]:
    yield from _app(tmp_path, api_keys=["tml-user"], operator_keys=["op-secret"])


def samples(text: str, name: str) -> dict[tuple, float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text) for s in family.samples if s.name == name
    }


def test_metrics_need_an_operator_key_when_api_keys_are_set(guarded: TestClient) -> None:
    assert guarded.get("/metrics").status_code == 401
    assert guarded.get("/metrics", headers={"X-API-Key": "tml-user"}).status_code == 403
    assert guarded.get("/metrics", headers={"Authorization": "Bearer tml-user"}).status_code == 403
    assert guarded.get("/metrics", headers={"X-API-Key": "op-secret"}).status_code == 200
    ok = guarded.get("/metrics", headers={"Authorization": "Bearer op-secret"})
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/plain")


def test_no_operator_key_configured_means_no_access(tmp_path: Path) -> None:
    for client in _app(tmp_path, api_keys=["tml-user"]):
        assert client.get("/metrics", headers={"X-API-Key": "tml-user"}).status_code == 403


def test_requests_are_counted_per_route_template(guarded: TestClient) -> None:
    user = {"X-API-Key": "tml-user"}
    guarded.post("/api/v1/client/config", json={"sdk_version": "0.38.0"}, headers=user)
    for sampler in ("a", "b"):
        guarded.get(f"/api/v1/samplers/{sampler}", headers=user)
    text = guarded.get("/metrics", headers={"X-API-Key": "op-secret"}).text
    counts = samples(text, "tx_http_requests_total")
    assert counts[(("method", "GET"), ("route", "/api/v1/samplers/{sampler_id}"), ("status", "404"))] == 2
    assert counts[(("method", "POST"), ("route", "/api/v1/client/config"), ("status", "200"))] == 1
    latency = samples(text, "tx_http_request_duration_seconds_count")
    assert latency[(("method", "GET"), ("route", "/api/v1/samplers/{sampler_id}"))] == 2
    assert samples(text, "tx_futures_pending")[()] == 0
    assert samples(text, "tx_engine_group_state")[(("base_model", "tiny-qwen3"), ("state", "absent"))] == 1


def test_two_apps_in_one_process_keep_their_own_metrics(tmp_path: Path) -> None:
    for first in _app(tmp_path / "a"):
        for second in _app(tmp_path / "b"):
            first.get("/api/v1/healthz")
            one = samples(first.get("/metrics").text, "tx_http_requests_total")
            two = samples(second.get("/metrics").text, "tx_http_requests_total")
            key = (("method", "GET"), ("route", "/api/v1/healthz"), ("status", "200"))
            assert one[key] == 1 and key not in two


def test_made_up_methods_and_paths_add_no_series(guarded: TestClient) -> None:
    """Finding 3 of the shared-server probe: the raw HTTP method was a label, so unauthenticated requests with
    made-up methods grew /metrics without a bound. Labels now come from a fixed set."""
    before = len(guarded.get("/metrics", headers={"X-API-Key": "op-secret"}).text)
    for i in range(200):
        guarded.request(f"X{i}METHOD", f"/no/such/path/{i}")
        guarded.request(f"Y{i}", "/api/v1/healthz")
    text = guarded.get("/metrics", headers={"X-API-Key": "op-secret"}).text
    counts = samples(text, "tx_http_requests_total")
    methods = {dict(key)["method"] for key in counts}
    routes = {dict(key)["route"] for key in counts}
    assert methods <= {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "other"}
    assert not any("/no/such/path" in route for route in routes)
    assert sum(value for key, value in counts.items() if dict(key)["method"] == "other") == 400
    assert len(text) < before + 20_000  # a handful of new series, not 400
