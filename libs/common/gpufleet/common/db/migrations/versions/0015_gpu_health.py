"""GPU health (issue 27): the machine's GPU health as its worker last reported it — the
state, the findings behind it and when the agent read its GPUs

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


# Nullable with no default (NULL: never reported), plain ADD/DROP COLUMN as in 0014.
def upgrade() -> None:
    op.add_column("machines", sa.Column("gpu_health", sa.String(16), nullable=True))
    op.add_column("machines", sa.Column("gpu_findings", sa.JSON(), nullable=True))
    op.add_column("machines", sa.Column("gpu_health_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("machines", "gpu_health_at")
    op.drop_column("machines", "gpu_findings")
    op.drop_column("machines", "gpu_health")
