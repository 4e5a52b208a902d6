"""The optimizer a training run was created with (AdamW or Dimuon); runs recorded before it trained with AdamW.

Revision ID: 0007
Follows: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_runs") as batch:
        batch.add_column(sa.Column("optimizer_config", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("training_runs") as batch:
        batch.drop_column("optimizer_config")
