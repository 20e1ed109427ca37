"""why a job waits (issue 24): the fleet tick's reason for a queued job, its words and the
expected ready time of the machine on its way

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


# Nullable and with no default: adding them rewrites no row (PostgreSQL stores the NULLs
# in the row header), and a job nobody looked at yet has no reason. Plain ADD/DROP COLUMN,
# not a batch: on SQLite a batch rebuilds the table and loses its partial indexes (see 0006).
def upgrade() -> None:
    op.add_column("jobs", sa.Column("pending_reason", sa.String(32), nullable=True))
    op.add_column("jobs", sa.Column("pending_message", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("pending_ready_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "pending_ready_at")
    op.drop_column("jobs", "pending_message")
    op.drop_column("jobs", "pending_reason")
