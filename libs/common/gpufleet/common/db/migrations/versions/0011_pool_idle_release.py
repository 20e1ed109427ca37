"""pool idle release (issue 8): a pool's own idle time and whether its warm capacity is
released; which machines hold a pool's warm capacity

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


# Plain ADD/DROP COLUMN, not a batch: on SQLite a batch rebuilds the table and loses its
# partial indexes (see 0006).
def upgrade() -> None:
    op.add_column(
        "pools", sa.Column("idle_release_after_s", sa.Float(), nullable=False, server_default="1800")
    )
    op.add_column("pools", sa.Column("warm_released", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("machines", sa.Column("warm_held", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("machines", "warm_held")
    op.drop_column("pools", "warm_released")
    op.drop_column("pools", "idle_release_after_s")
