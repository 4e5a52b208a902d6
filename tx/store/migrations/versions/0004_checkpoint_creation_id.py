"""checkpoints.creation_id: the identity of one save of a checkpoint, new at every save (also under a name saved
before). Signed download links name it, so a link dies with the checkpoint it was made for, never opening a
checkpoint re-created under the same name. Rows saved before this revision get one each.

Revision ID: 0004
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("checkpoints", sa.Column("creation_id", sa.String(32), nullable=True))
    bind = op.get_bind()
    keys = bind.execute(sa.text("SELECT run_id, checkpoint_id FROM checkpoints")).all()
    for run_id, checkpoint_id in keys:
        bind.execute(sa.text("UPDATE checkpoints SET creation_id = :id WHERE run_id = :run AND checkpoint_id = :ck"),
                     {"id": uuid.uuid4().hex, "run": run_id, "ck": checkpoint_id})
    with op.batch_alter_table("checkpoints") as batch:
        batch.alter_column("creation_id", existing_type=sa.String(32), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("creation_id")
