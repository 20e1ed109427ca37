"""the product backend's workspace API (issue 8): idempotency and times on workspaces

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpufleet.common.db.models

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_TIME = gpufleet.common.db.models.UTCDateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        batch.add_column(sa.Column("request_id", sa.String(128), nullable=True))
        batch.add_column(sa.Column("request_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("created_at", _TIME, nullable=True))
        batch.add_column(sa.Column("updated_at", _TIME, nullable=True))
        batch.create_unique_constraint("uq_workspaces_request_id", ["request_id"])


def downgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        batch.drop_constraint("uq_workspaces_request_id", type_="unique")
        batch.drop_column("updated_at")
        batch.drop_column("created_at")
        batch.drop_column("request_hash")
        batch.drop_column("request_id")
