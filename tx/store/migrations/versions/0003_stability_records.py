"""Stability records: the sequences sampled with `record_stability_info`, read back by StableReinforce training.

Revision ID: 0003
Follows: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stability_records",
        sa.Column("sequence_id", sa.String(200), primary_key=True),
        sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.session_id"), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("sampler_id", sa.String(160), nullable=False),
        sa.Column("base_model", sa.String(256), nullable=False),
        sa.Column("weights_version", sa.Integer(), nullable=True),
        sa.Column("prompt_length", sa.Integer(), nullable=False),
        sa.Column("num_tokens", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.LargeBinary(), nullable=False),
        sa.Column("logprobs", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_stability_records_last_used_at", "stability_records", ["last_used_at"])
    op.create_index("ix_stability_records_session_used", "stability_records", ["session_id", "last_used_at"])


def downgrade() -> None:
    op.drop_table("stability_records")
