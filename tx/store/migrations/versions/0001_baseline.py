"""The schema as tx wrote it before migrations existed (main at a55a28d): sessions, training runs,
checkpoints and sampling sessions. A store that old is stamped with this revision, not migrated by it.

Revision ID: 0001
"""

from __future__ import annotations

from alembic import op

from tx.store.baseline import baseline_schema

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    baseline_schema().create_all(op.get_bind())


def downgrade() -> None:
    for table in ("sampling_sessions", "checkpoints", "training_runs", "sessions"):
        op.drop_table(table)
