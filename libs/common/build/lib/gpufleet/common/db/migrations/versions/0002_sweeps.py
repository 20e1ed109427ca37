"""sweeps: one row per sweeper pass, for SweeperService.ListSweeps

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpufleet.common.db.models

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('sweeps',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('request_id', sa.String(length=128), nullable=True),
    sa.Column('started_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('ended_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('instances_seen', sa.Integer(), nullable=False),
    sa.Column('machines_updated', sa.Integer(), nullable=False),
    sa.Column('orphans_seen', sa.Integer(), nullable=False),
    sa.Column('orphans_destroyed', sa.Integer(), nullable=False),
    sa.Column('unreachable', sa.JSON(), nullable=False),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('request_id')
    )
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.create_index('ix_sweeps_kind', ['kind', 'id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_index('ix_sweeps_kind')
    op.drop_table('sweeps')
