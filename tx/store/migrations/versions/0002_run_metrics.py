"""run_metrics: what each training call of a run measured (loss per token, tokens, trainer time, grad norm,
learning rate, an RL loss's own outputs), for the console's curves; bounded per run by tx/core/run_metrics.py.

Revision ID: 0002
Follows: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_metrics",
        sa.Column("run_id", sa.String(128), sa.ForeignKey("training_runs.run_id"), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("finished", sa.Float(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("total_tokens", sa.BigInteger(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_metrics")
