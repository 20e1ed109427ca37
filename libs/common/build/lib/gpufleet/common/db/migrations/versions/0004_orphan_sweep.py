"""the sweeper's orphan sweep (issue 4): orphans seen at the providers, and whether each
provider could be listed round after round

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpufleet.common.db.models

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orphans",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("provider_instance_id", sa.String(length=128), nullable=False),
        sa.Column("machine_label", sa.String(length=64), nullable=True),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("zone", sa.String(length=64), nullable=False),
        sa.Column("instance_type", sa.String(length=64), nullable=False),
        sa.Column("capacity_type", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("launch_time", gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("first_seen_at", gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("destroyed_at", gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("action_at", gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("orphans", schema=None) as batch_op:
        batch_op.create_index("ux_orphans_instance", ["provider", "provider_instance_id"], unique=True)
        batch_op.create_index("ix_orphans_action", ["action"], unique=False)

    op.create_table(
        "provider_listings",
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("failed_rounds", sa.Integer(), nullable=False),
        sa.Column("failing_since", gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_listed_at", gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("provider"),
    )


def downgrade() -> None:
    op.drop_table("provider_listings")
    with op.batch_alter_table("orphans", schema=None) as batch_op:
        batch_op.drop_index("ix_orphans_action")
        batch_op.drop_index("ux_orphans_instance")
    op.drop_table("orphans")
