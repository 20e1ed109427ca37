"""job tokens (issue 7): one row per token an attempt was given — its hash only, never the
token — with the scope, whom it names, its spend cap, what it spent and when it expires

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_tokens",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("workspace_id", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("attempt_id", sa.String(64), sa.ForeignKey("attempts.id"), nullable=False),
        sa.Column("spend_cap_micros", sa.BigInteger(), nullable=False),
        sa.Column("spent_micros", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_job_tokens_attempt", "job_tokens", ["attempt_id"])


def downgrade() -> None:
    op.drop_index("ix_job_tokens_attempt", table_name="job_tokens")
    op.drop_table("job_tokens")
