"""jobs.disruptions_used (issue 27): the ends a job cannot have caused, counted apart

A dispatch taken back, a GPU's hardware fault, a machine the cloud took back and a job the
platform stopped while it ran well (the machine's lease fence) no longer spend the job's
patient lost-retry budget (gpufleet.common.job_lifecycle); they are counted here against a
wide bound instead. Existing jobs start at 0.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("disruptions_used", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("jobs", "disruptions_used")
