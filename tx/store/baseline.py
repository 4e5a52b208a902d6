"""The store's schema at the baseline migration (main a55a28d, before migrations existed), frozen: the
baseline migration creates it, and a store older than migrations gets its missing columns from it. Later
schema changes are migrations of their own; this file never changes.
"""

from __future__ import annotations

import sqlalchemy as sa

TIME = sa.DateTime(timezone=True)


def baseline_schema() -> sa.MetaData:
    """The four tables as tx a55a28d created them, in a MetaData of their own."""
    schema = sa.MetaData()
    sa.Table(
        "sessions", schema,
        sa.Column("session_id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False, index=True),
        sa.Column("sdk_version", sa.String(32)),
        sa.Column("tags", sa.JSON, nullable=False),
        sa.Column("user_metadata", sa.JSON, nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("last_heartbeat", TIME, nullable=False),
        sa.Column("finished_at", TIME),
        sa.Column("finish_reason", sa.String(32)),
        sa.Column("project_id", sa.String(128)),
        sa.Column("display_name", sa.String(256)),
    )
    sa.Table(
        "training_runs", schema,
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.session_id"), nullable=False, index=True),
        sa.Column("owner", sa.String(64), nullable=False, index=True),
        sa.Column("base_model", sa.String(256), nullable=False),
        sa.Column("lora_rank", sa.Integer, nullable=False),
        sa.Column("lora_config", sa.JSON, nullable=False),
        sa.Column("user_metadata", sa.JSON),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("last_request_time", TIME, nullable=False),
        sa.Column("corrupted", sa.Boolean, nullable=False),
    )
    sa.Table(
        "checkpoints", schema,
        sa.Column("run_id", sa.String(128), sa.ForeignKey("training_runs.run_id"), primary_key=True),
        sa.Column("checkpoint_id", sa.String(300), primary_key=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False, index=True),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("expires_at", TIME, index=True),
        sa.Column("user_metadata", sa.JSON),
        sa.Column("public", sa.Boolean, nullable=False),
    )
    sa.Table(
        "sampling_sessions", schema,
        sa.Column("sampling_session_id", sa.String(160), primary_key=True),
        sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.session_id"), nullable=False, index=True),
        sa.Column("owner", sa.String(64), nullable=False, index=True),
        sa.Column("base_model", sa.String(256), nullable=False),
        sa.Column("model_path", sa.String(512)),
        sa.Column("run_id", sa.String(128)),
        sa.Column("weights_dir", sa.String(1024)),
        sa.Column("created_at", TIME, nullable=False),
    )
    return schema
