"""films beside shorts (issue 8): a machine's earmark for a film, a kind's expected duration

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpufleet.common.db.models

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_TIME = gpufleet.common.db.models.UTCDateTime(timezone=True)


# Plain ADD/DROP COLUMN on machines, not a batch: on SQLite a batch rebuilds the table and
# loses its partial indexes (see 0006).
def upgrade() -> None:
    op.add_column("machines", sa.Column("earmarked_for", sa.String(64), nullable=True))
    op.add_column("machines", sa.Column("earmarked_at", _TIME, nullable=True))
    op.add_column("job_kinds", sa.Column("expected_duration_s", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("job_kinds", "expected_duration_s")
    op.drop_column("machines", "earmarked_at")
    op.drop_column("machines", "earmarked_for")
