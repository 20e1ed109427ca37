"""The reapers' scan queries: one query per scan, destroyed machines excluded in SQL.

Every scan reads the machine row and, in the same statement, how many live attempts hold
it (a correlated count over ``ix_attempts_machine``), so deciding never costs a round trip
per machine. ``state <> 'DESTROYED'`` is part of every scan's WHERE clause — not a check
in Python after the fact — because a scan that forgets it keeps feeding dead machines to
the chain: re-armed timers and stop calls for instances deleted long ago.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from sqlalchemy import ColumnElement, Row, exists, func, literal_column, select
from sqlalchemy.orm import Session

from gpufleet.common.convert import offering_of_machine
from gpufleet.common.db.enums import LIVE_ATTEMPT_STATES, MachineOrigin, MachineState
from gpufleet.common.db.models import Attempt, Machine
from gpufleet.reaper.refusal import MachineSnapshot
from gpufleet.v1 import machine_pb2

_LIVE = sorted(s.value for s in LIVE_ATTEMPT_STATES)


def not_destroyed() -> ColumnElement[bool]:
    """The predicate every scan carries (it also matches the partial indexes)."""
    return Machine.state != MachineState.DESTROYED.value


def state_in(states: Iterable[str]) -> ColumnElement[bool]:
    """``state IN ('A', 'B')`` with the values written into the SQL, not bound.

    A partial index is used only when the planner can prove the query implies the
    index's predicate; literal values make that proof independent of how the driver
    binds parameters, so each net's scan reads its own small index.
    """
    return Machine.state.in_([literal_column(f"'{MachineState(s).value}'") for s in sorted(states)])


def no_live_attempt() -> ColumnElement[bool]:
    """True while no STARTING/RUNNING attempt holds the machine (for claiming writes)."""
    return ~exists().where(Attempt.machine_id == Machine.id, Attempt.state.in_(_LIVE))


def ours() -> list[ColumnElement[bool]]:
    """Provisioned by us and managed by us: the first rung of the ladder, in SQL."""
    return [Machine.origin == MachineOrigin.PROVISIONED.value, Machine.managed.is_(True)]


# The columns a snapshot is made of: a scan reads these, never whole ORM entities, so a
# scan that returns every running machine (the idle scanner's) stays cheap per row.
_CORE = (
    Machine.id,
    Machine.origin,
    Machine.managed,
    Machine.state,
    Machine.intent,
    Machine.workload_class,
    Machine.first_observed_at,
    Machine.stop_due_at,
    Machine.destroy_due_at,
    Machine.agent_address,
    Machine.provider_instance_id,
    Machine.warm_held,
)
# The lifecycle and the three liveness channels: what the nets other than the money
# chain's head decide on.
_LIFECYCLE = (
    Machine.lost,
    Machine.requested_at,
    Machine.provision_deadline_at,
    Machine.state_changed_at,
    Machine.startup_failed_at,
    Machine.provider_seen_at,
    Machine.probe_ok_at,
    Machine.probe_failed_since,
    Machine.worker_report_at,
)
# What a provider call must name: the offering the machine was bought with.
_OFFERING = (
    Machine.offering_id,
    Machine.provider,
    Machine.region,
    Machine.zone,
    Machine.instance_type,
    Machine.gpu_model,
    Machine.gpu_count,
    Machine.slots,
    Machine.capacity_type,
    Machine.hourly_price_micros,
)


def scan(
    session: Session,
    where: Sequence[ColumnElement[bool]],
    *,
    with_offering: bool = True,
    with_lifecycle: bool = True,
) -> list[MachineSnapshot]:
    """Live machines matching ``where``, each with its live-attempt count, in one query.

    ``with_offering=False`` leaves ``offering`` unset (a net that never calls the
    provisioner); ``with_lifecycle=False`` leaves the lifecycle and liveness fields unset
    (a net that decides on none of them).
    """
    live = (
        select(func.count())
        .where(Attempt.machine_id == Machine.id, Attempt.state.in_(_LIVE))
        .correlate(Machine)
        .scalar_subquery()
    )
    columns = [
        *_CORE,
        *(_LIFECYCLE if with_lifecycle else ()),
        *(_OFFERING if with_offering else ()),
        live.label("live_attempts"),
    ]
    rows = session.execute(select(*columns).where(not_destroyed(), *where).order_by(Machine.id)).all()
    return [_to_snapshot(row, with_offering, with_lifecycle) for row in rows]


def _offering(row: Row[Any]) -> machine_pb2.Offering | None:
    try:
        # The row carries the offering under the machine's own attribute names.
        return offering_of_machine(cast(Machine, row))
    except ValueError:
        # A provider/capacity name the protos do not know: the snapshot still gates
        # correctly; a provider call for it fails at the provisioner, visibly.
        return None


def _to_snapshot(row: Row[Any], with_offering: bool, with_lifecycle: bool) -> MachineSnapshot:
    m = row._mapping
    lifecycle: dict[str, Any] = {c.key: m[c.key] for c in _LIFECYCLE} if with_lifecycle else {}
    return MachineSnapshot(
        machine_id=m["id"],
        origin=m["origin"],
        managed=m["managed"],
        state=m["state"],
        intent=m["intent"],
        workload_class=m["workload_class"],
        live_attempts=int(m["live_attempts"]),
        first_observed_at=m["first_observed_at"],
        stop_due_at=m["stop_due_at"],
        destroy_due_at=m["destroy_due_at"],
        agent_address=m["agent_address"],
        provider_instance_id=m["provider_instance_id"],
        warm_held=bool(m["warm_held"]),
        offering=_offering(row) if with_offering else None,
        **lifecycle,
    )
