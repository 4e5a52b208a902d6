"""copy_weights: a training run may hold a copy of another checkpoint (`copied_from`), made once per
idempotency key (`copy_request`, unique per owner).

Revision ID: 0005
Follows: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_runs") as batch:
        batch.add_column(sa.Column("copied_from", sa.String(512), nullable=True))
        batch.add_column(sa.Column("copy_request", sa.String(160), nullable=True))
        batch.create_index("ix_training_runs_copy_request", ["owner", "copy_request"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("training_runs") as batch:
        batch.drop_index("ix_training_runs_copy_request")
        batch.drop_column("copy_request")
        batch.drop_column("copied_from")
