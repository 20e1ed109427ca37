"""the reaper's machine-level nets (issue 3): one partial index per net's scan

Each net reads only the machines its question is about, so a full pass of every
watchdog costs time in proportion to the machines due, not to the fleet's history
(DESTROYED rows and healthy machines stay outside every one of these indexes).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

RUNNING = "state IN ('BOOTING', 'DRAINING', 'READY')"
PRE_CONTACT = "state IN ('BOOTING', 'PROVISIONING', 'REQUESTED')"
TRANSITIONAL = "state IN ('DESTROYING', 'PROVISIONING', 'STARTING', 'STOPPING')"

# (name, column, predicate): the same text as the models' Index objects.
INDEXES: list[tuple[str, str, str]] = [
    # boot failure: running machines that have not reported in this life
    (
        "ix_machines_running_unreported",
        "first_observed_at",
        f"{RUNNING} AND (worker_report_at IS NULL OR worker_report_at < first_observed_at)",
    ),
    # went silent: a range over the worker's report clock of running machines
    ("ix_machines_running_worker_report", "worker_report_at", RUNNING),
    # provision deadline: machines never heard from, by deadline
    (
        "ix_machines_pre_contact_deadline",
        "provision_deadline_at",
        f"{PRE_CONTACT} AND probe_ok_at IS NULL AND worker_report_at IS NULL",
    ),
    # lost detector: probes failing, and machines marked lost
    ("ix_machines_probe_failing", "probe_failed_since", "probe_failed_since IS NOT NULL"),
    ("ix_machines_lost", "id", "lost"),
    # stuck transition: transitional machines by time in the state
    ("ix_machines_transitional", "state_changed_at", TRANSITIONAL),
]


def upgrade() -> None:
    for name, column, where in INDEXES:
        op.create_index(
            name,
            "machines",
            [column],
            unique=False,
            postgresql_where=sa.text(where),
            sqlite_where=sa.text(where),
        )


def downgrade() -> None:
    for name, _column, _where in reversed(INDEXES):
        op.drop_index(name, table_name="machines")
