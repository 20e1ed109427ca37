"""checkpoints that survive a lost attempt (issue 8): the checkpoint rows, and which one
each attempt started from

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpufleet.common.db.models

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_TIME = gpufleet.common.db.models.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("attempt_id", sa.String(64), sa.ForeignKey("attempts.id"), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("discarded_at", _TIME, nullable=True),
        sa.UniqueConstraint("job_id", "sequence", name="uq_checkpoints_job_sequence"),
    )
    # Plain ADD COLUMN, not a batch: on SQLite a batch rebuilds the table and loses its
    # partial indexes (see 0006).
    op.add_column("attempts", sa.Column("checkpoint_id", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("attempts", "checkpoint_id")
    op.drop_table("checkpoints")
