"""the scheduler's request-level watchdogs (issue 8): an incident can be resolved

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpufleet.common.db.models

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain add: no table rebuild on SQLite.
    op.add_column(
        "incidents",
        sa.Column("resolved_at", gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.drop_column("resolved_at")
