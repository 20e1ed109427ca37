"""the walls between slots (issue 10): each job kind's cgroup limits

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_kinds") as batch:
        batch.add_column(sa.Column("memory_limit_mb", sa.Integer(), nullable=False, server_default="8192"))
        batch.add_column(sa.Column("pids_limit", sa.Integer(), nullable=False, server_default="1024"))


def downgrade() -> None:
    with op.batch_alter_table("job_kinds") as batch:
        batch.drop_column("pids_limit")
        batch.drop_column("memory_limit_mb")
