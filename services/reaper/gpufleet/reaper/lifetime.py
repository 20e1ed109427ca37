"""Which life of a machine a worker report belongs to — one definition, in Python and SQL.

A machine that is stopped and started again keeps its row, and with it the worker's last
report from before the stop. Each start records a fresh ``first_observed_at`` (when this
platform saw it running this time), so a report counts for the current life only if it
is not older than that. The two report-reading nets split on it and never overlap:

- boot failure owns a machine that has **not reported in this life** (never, or only
  before its latest start), counted from ``first_observed_at``;
- went silent owns one that **has reported in this life** and then stopped, counted
  from ``worker_report_at``.

``first_observed_at`` only says which life a report belongs to; whether the worker is
alive is read from ``worker_report_at`` alone.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, and_, or_

from gpufleet.common.db.models import Machine
from gpufleet.reaper.refusal import MachineSnapshot


def reported_this_life(machine: MachineSnapshot) -> bool:
    if machine.worker_report_at is None:
        return False
    return machine.first_observed_at is None or machine.worker_report_at >= machine.first_observed_at


def reported_this_life_sql() -> ColumnElement[bool]:
    return and_(
        Machine.worker_report_at.is_not(None),
        or_(Machine.first_observed_at.is_(None), Machine.worker_report_at >= Machine.first_observed_at),
    )


def unreported_this_life_sql() -> ColumnElement[bool]:
    """The exact complement of :func:`reported_this_life_sql` (it is also a partial index's predicate)."""
    return or_(Machine.worker_report_at.is_(None), Machine.worker_report_at < Machine.first_observed_at)
