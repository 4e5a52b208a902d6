"""The store on SQLite, and on PostgreSQL when TX_TEST_POSTGRES_URL points at one: a database of this run's own
(created and dropped here), so that branches whose migrations differ never meet in one schema."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from tx.store.store import Store

POSTGRES_URL = os.environ.get("TX_TEST_POSTGRES_URL")


@pytest.fixture(scope="session")
def postgres_db() -> Iterator[str]:
    """The URL of an empty PostgreSQL database, dropped at the end of the run."""
    if not POSTGRES_URL:
        pytest.skip("set TX_TEST_POSTGRES_URL to run the store tests on PostgreSQL")
    name = f"tx_store_{uuid.uuid4().hex[:12]}"
    server = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    with server.connect() as conn:
        conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    server.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path / 'tx.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_db")
    s = Store.from_url(url)
    yield s
    s.close()
