"""The audit log: who did what to which run, checkpoint and key (bounded by the janitor).

Revision ID: 0006
Follows: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("subject_owner", sa.String(64), nullable=True),
        sa.Column("run_id", sa.String(128), nullable=True),
        sa.Column("tinker_path", sa.String(512), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_actor", "audit_log", ["actor"])
    op.create_index("ix_audit_log_subject_owner", "audit_log", ["subject_owner"])


def downgrade() -> None:
    op.drop_table("audit_log")
