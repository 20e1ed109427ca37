"""the scheduler at fleet scale (issue 11): provider calls and dispatch outside the tick

``machines.pending_call`` records, before the call is made, which provider call the fleet
tick handed to its call pool (``create`` or ``start``) and since when; it is cleared when
the answer is recorded. A new leader re-issues a call still marked pending (the drivers are
idempotent by machine id), so a create that was running when leadership moved is adopted,
never left PROVISIONING by accident and never started twice.

``dispatch_failures`` / ``dispatch_backoff_until``: a machine whose agent keeps failing
StartJob is not chosen again until its back-off has passed.

``attempts.holds_slot``: an attempt ended by the control plane (cancelled, timed out, taken
back) keeps its slot until the machine's worker reports it gone, so no job is sent to a
slot the machine has not freed yet.

``state_changed_by`` / ``state_reason``: who made the machine's last state change (the
lifecycle's actor) and why (the net, the ledger row, the operator's words).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpufleet.common.db.models

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


# Plain ADD/DROP COLUMN, not a batch: on SQLite a batch rebuilds the table and loses the
# expression index of migration 0003 (ix_machines_running_report_clock).
COLUMNS = (
    ("pending_call", lambda: sa.Column("pending_call", sa.String(16), nullable=True)),
    (
        "pending_call_at",
        lambda: sa.Column(
            "pending_call_at", gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True
        ),
    ),
    (
        "dispatch_failures",
        lambda: sa.Column("dispatch_failures", sa.Integer(), nullable=False, server_default="0"),
    ),
    (
        "dispatch_backoff_until",
        lambda: sa.Column(
            "dispatch_backoff_until", gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True
        ),
    ),
    (
        "state_changed_by",
        lambda: sa.Column("state_changed_by", sa.String(16), nullable=False, server_default=""),
    ),
    ("state_reason", lambda: sa.Column("state_reason", sa.String(500), nullable=False, server_default="")),
)


def upgrade() -> None:
    for _name, column in COLUMNS:
        op.add_column("machines", column())
    op.add_column("attempts", sa.Column("holds_slot", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("attempts", "holds_slot")
    for name, _column in reversed(COLUMNS):
        op.drop_column("machines", name)
