"""Training runs record the base model's weights they were created on (its hub revision and fingerprint), and
carry a name and tags set by their owner. Runs recorded before have none of them (NULL): they load onto any base
of their name, as before.

Revision ID: 0009
Follows: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_runs") as batch:
        batch.add_column(sa.Column("base_revision", sa.String(64), nullable=True))
        batch.add_column(sa.Column("base_fingerprint", sa.String(80), nullable=True))
        batch.add_column(sa.Column("name", sa.String(120), nullable=True))
        batch.add_column(sa.Column("tags", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("training_runs") as batch:
        for column in ("tags", "name", "base_fingerprint", "base_revision"):
            batch.drop_column(column)
