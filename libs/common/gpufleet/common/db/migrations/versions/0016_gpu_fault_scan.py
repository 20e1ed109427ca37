"""the reaper's gpu_fault net (issue 27): a partial index for its scan

The net reads the few machines with a critical GPU state or a cordon (the scheduler cordons
on every critical finding), so its pass costs time in proportion to them, not to the fleet.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# The same text as the model's Index (gpufleet.common.db.models.REAPER_NET_INDEXES).
NAME = "ix_machines_gpu_faulted"
WHERE = "state <> 'DESTROYED' AND (gpu_health = 'critical' OR cordoned)"


def upgrade() -> None:
    op.create_index(
        NAME, "machines", ["id"], unique=False, postgresql_where=sa.text(WHERE), sqlite_where=sa.text(WHERE)
    )


def downgrade() -> None:
    op.drop_index(NAME, table_name="machines")
