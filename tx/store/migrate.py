"""The store's schema, brought to the newest migration (`migrations/versions/`) when tx opens a store.

- A new database gets every migration, from the baseline up.
- A store written before migrations existed (tables, no `alembic_version`) gets the baseline's tables and
  columns it may lack (the rule tx followed before: new columns nullable, no backfill), is stamped with the
  baseline, then migrated.
- A store stamped with a revision this tx does not know (written by a newer tx) is refused: tx never runs
  on a schema it does not understand.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, MetaData, inspect, text
from sqlalchemy.engine import Engine

from tx.store.baseline import baseline_schema

MIGRATIONS = Path(__file__).parent / "migrations"
BASELINE = "0001"


class SchemaTooNewError(RuntimeError):
    """The store was migrated by a newer tx than this one."""


def upgrade_to_head(engine: Engine) -> str:
    """Migrate the store to the newest revision; returns it."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None, "no migrations found"
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        tables = inspect(conn)
        baseline = baseline_schema()
        if not tables.has_table("alembic_version") and any(tables.has_table(t) for t in baseline.tables):
            baseline.create_all(conn)  # the tables it lacks (checkfirst)
            add_missing_columns(conn, baseline)
            command.stamp(config, BASELINE)
        current = MigrationContext.configure(conn).get_current_revision()
        known = {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}
        if current is not None and current not in known:
            raise SchemaTooNewError(f"the store is at schema revision {current}, which this tx does not know "
                                    f"(its newest is {head}): a newer tx wrote it; upgrade tx")
        command.upgrade(config, "head")
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def add_missing_columns(conn: Connection, schema: MetaData) -> None:
    """Add `schema`'s columns to tables an older tx created (nullable, no backfill)."""
    existing = inspect(conn)
    for table in schema.sorted_tables:
        if not existing.has_table(table.name):
            continue
        have = {c["name"] for c in existing.get_columns(table.name)}
        for column in table.columns:
            if column.name not in have:
                kind = column.type.compile(conn.dialect)
                conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}'))
