"""kind defaults (issue 24): the pool and pipeline version SubmitJob fills in when a job of
the kind leaves them out

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


# Plain ADD/DROP COLUMN, not a batch: on SQLite a batch rebuilds the table and loses its
# partial indexes (see 0006).
def upgrade() -> None:
    op.add_column("job_kinds", sa.Column("default_pool", sa.String(64), nullable=True))
    op.add_column("job_kinds", sa.Column("default_pipeline_version", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("job_kinds", "default_pipeline_version")
    op.drop_column("job_kinds", "default_pool")
