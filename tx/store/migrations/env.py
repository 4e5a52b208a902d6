"""Alembic's environment for tx: migrations run on the connection `tx/store/migrate.py` hands over (never a
URL from a config file), with the store's own tables as the target metadata."""

from __future__ import annotations

from alembic import context

from tx.store.tables import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
