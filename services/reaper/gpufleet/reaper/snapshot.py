"""The reapers' scan queries: one query per scan, destroyed machines excluded in SQL.

Every scan reads the machine row and, in the same statement, how many live attempts hold
it (a correlated count over ``ix_attempts_machine``), so deciding never costs a round trip
per machine. ``state <> 'DESTROYED'`` is part of every scan's WHERE clause — not a check
in Python after the fact — because a scan that forgets it keeps feeding dead machines to
the chain: re-armed timers and stop calls for instances deleted long ago.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, exists, func, select
from sqlalchemy.orm import Session

from gpufleet.common.convert import offering_of_machine
from gpufleet.common.db.enums import LIVE_ATTEMPT_STATES, MachineOrigin, MachineState
from gpufleet.common.db.models import Attempt, Machine
from gpufleet.reaper.refusal import MachineSnapshot

_LIVE = sorted(s.value for s in LIVE_ATTEMPT_STATES)


def not_destroyed() -> ColumnElement[bool]:
    """The predicate every scan carries (it also matches the partial indexes)."""
    return Machine.state != MachineState.DESTROYED.value


def no_live_attempt() -> ColumnElement[bool]:
    """True while no STARTING/RUNNING attempt holds the machine (for claiming writes)."""
    return ~exists().where(Attempt.machine_id == Machine.id, Attempt.state.in_(_LIVE))


def ours() -> list[ColumnElement[bool]]:
    """Provisioned by us and managed by us: the first rung of the ladder, in SQL."""
    return [Machine.origin == MachineOrigin.PROVISIONED.value, Machine.managed.is_(True)]


def scan(session: Session, where: Sequence[ColumnElement[bool]]) -> list[MachineSnapshot]:
    """Live machines matching ``where``, each with its live-attempt count, in one query."""
    live = (
        select(func.count())
        .where(Attempt.machine_id == Machine.id, Attempt.state.in_(_LIVE))
        .correlate(Machine)
        .scalar_subquery()
    )
    rows = session.execute(select(Machine, live).where(not_destroyed(), *where).order_by(Machine.id)).all()
    return [to_snapshot(machine, int(count)) for machine, count in rows]


def to_snapshot(m: Machine, live_attempts: int) -> MachineSnapshot:
    offering = None
    try:
        offering = offering_of_machine(m)
    except ValueError:
        # A provider/capacity name the protos do not know: the snapshot still gates
        # correctly; a provider call for it fails at the provisioner, visibly.
        offering = None
    return MachineSnapshot(
        machine_id=m.id,
        origin=m.origin,
        managed=m.managed,
        state=m.state,
        intent=m.intent,
        workload_class=m.workload_class,
        live_attempts=live_attempts,
        first_observed_at=m.first_observed_at,
        stop_due_at=m.stop_due_at,
        destroy_due_at=m.destroy_due_at,
        agent_address=m.agent_address,
        provider_instance_id=m.provider_instance_id,
        offering=offering,
    )
