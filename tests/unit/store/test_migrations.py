"""The store's schema comes from its migrations (tx/store/migrations), on SQLite and on PostgreSQL: a new store
is migrated to the head, the head matches the tables the code declares, and a store written by the previous
main (before migrations; tests/unit/store/previous_main/) is upgraded with every row kept."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from tx.store.migrate import SchemaTooNewError, current_revision, upgrade_to_head
from tx.store.store import Store
from tx.store.tables import Base

POSTGRES_URL = os.environ.get("TX_TEST_POSTGRES_URL")
PREVIOUS_MAIN = Path(__file__).parent / "previous_main"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_db(request, tmp_path) -> Iterator[str]:
    """The URL of an empty database of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tx.db'}"
        return
    if not POSTGRES_URL:
        pytest.skip("set TX_TEST_POSTGRES_URL to run the migration tests on PostgreSQL")
    name = f"tx_migrate_{uuid.uuid4().hex[:12]}"
    server = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    with server.connect() as conn:
        conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    server.dispose()


def _dialect(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgres"


def _run_script(engine: Engine, script: str) -> None:
    lines = [line for line in script.splitlines() if not line.startswith("--")]
    statements = [s.strip() for s in "\n".join(lines).split(";\n") if s.strip()]
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement.rstrip(";"))


def test_a_new_store_is_migrated_to_the_head_which_matches_the_declared_tables(empty_db: str) -> None:
    store = Store.from_url(empty_db)
    try:
        engine = store._engine
        head = upgrade_to_head(engine)  # a second run changes nothing
        assert current_revision(engine) == head
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"tables.py and the migrations disagree (add a migration): {diff}"
    finally:
        store.close()


def test_a_store_written_by_the_previous_main_is_upgraded_with_its_rows(empty_db: str) -> None:
    engine = create_engine(empty_db)
    _run_script(engine, (PREVIOUS_MAIN / f"{_dialect(empty_db)}.sql").read_text())
    engine.dispose()
    store = Store.from_url(empty_db)
    try:
        assert current_revision(store._engine) is not None
        session = store.get_session("s1", "tml-alice")
        assert (session.project_id, session.display_name, session.user_metadata) == ("p1", "first", {"k": "v"})
        assert store.get_session("s2", "tml-bob").finish_reason == "success"
        run = store.get_run("s1:train:0", "tml-alice")
        assert run.lora_config["rank"] == 8 and run.user_metadata == {"note": "x"}
        # 0009: no base weights recorded (so its checkpoints load onto any base of its name), no name, no tags
        assert (run.base_revision, run.base_fingerprint, run.name, run.tags) == (None, None, None, None)
        store.set_run_labels("s1:train:0", "tml-alice", "named later", ["old"])
        assert (store.get_run("s1:train:0", "tml-alice").name, store.get_run("s1:train:0", "tml-alice").tags) == (
            "named later", ["old"])
        published = store.get_checkpoint("s1:train:0", "weights/step-1", "tml-bob", public_ok=True)
        assert published.size_bytes == 1234 and published.expires_at is not None
        assert {c.checkpoint_id for c in store.list_checkpoints("s1:train:0", "tml-alice")} == {
            "weights/step-1", "sampler_weights/s1"}
        assert store.get_sampling_session("s1:sample:0", "tml-alice").weights_dir == "/data/checkpoints/x"
    finally:
        store.close()


def test_a_store_from_a_newer_tx_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tx.db'}"
    Store.from_url(url).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))
    with pytest.raises(SchemaTooNewError, match="ffff"):
        upgrade_to_head(engine)
    engine.dispose()
