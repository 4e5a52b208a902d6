"""join_sampling_session: how many clients joined each sampling session (the next one gets that count + 1).

Revision ID: 0008
Follows: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sampling_sessions") as batch:
        batch.add_column(sa.Column("clients_joined", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("sampling_sessions") as batch:
        batch.drop_column("clients_joined")
