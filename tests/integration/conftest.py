from __future__ import annotations

from collections.abc import Iterator

import pytest
import tinker

from txserver import API_KEY, TxServer


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """One tx server for the integration tests, on the built-in tiny model."""
    srv = TxServer(tmp_path_factory.mktemp("tx-data"), args=["--seq-gap-timeout-s", "3"]).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def workers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """A tx server whose trainer runs on 2 worker processes (FSDP2 over gloo); they start on the first run."""
    args = ["--seq-gap-timeout-s", "3", "--trainer-workers", "2"]
    srv = TxServer(tmp_path_factory.mktemp("tx-workers"), args=args).start()
    yield srv
    srv.stop()


@pytest.fixture
def service_client(server: TxServer) -> Iterator[tinker.ServiceClient]:
    client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    yield client
    client.close("success")
