"""the reaper's machine-level nets (issue 3): one partial index per net's scan

Each net reads only the machines its question is about, so a full pass of every
watchdog costs time in proportion to the machines due, not to the fleet's history
(DESTROYED rows and healthy machines stay outside these indexes, or at their far end).

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

LIVE = "state <> 'DESTROYED'"
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
    # provision deadline: machines never heard from, by deadline
    (
        "ix_machines_pre_contact_deadline",
        "provision_deadline_at",
        f"{PRE_CONTACT} AND probe_ok_at IS NULL AND worker_report_at IS NULL",
    ),
    # lost detector: probes failing, and machines marked lost
    ("ix_machines_probe_failing", "probe_failed_since", f"probe_failed_since IS NOT NULL AND {LIVE}"),
    ("ix_machines_lost", "id", f"lost AND {LIVE}"),
    # stuck transition: transitional machines by time in the state
    ("ix_machines_transitional", "state_changed_at", TRANSITIONAL),
]


# went silent: the worker's report clock of running machines, as an expression that is
# NULL for every other machine. Not partial, on purpose: PostgreSQL keeps statistics for
# an expression index (never for a partial one), so it knows the running machines report
# every few seconds and reads the few silent ones from this index — instead of judging
# the range by the whole table, where destroyed history makes every report look old.
REPORT_CLOCK = ("ix_machines_running_report_clock", f"(CASE WHEN {RUNNING} THEN worker_report_at END)")


def upgrade() -> None:
    op.create_index(REPORT_CLOCK[0], "machines", [sa.text(REPORT_CLOCK[1])], unique=False)
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
    op.drop_index(REPORT_CLOCK[0], table_name="machines")
