"""Went silent: a machine whose worker reported and then stopped is destroyed (DESIGN §4,
every 60 s).

Its gate reads the worker's own report clock (``worker_report_at``) **and nothing else**.
The provider poll and the control-plane probe are written by something other than the
workload — the provider is happy to keep listing a billing instance, and the agent keeps
answering while the worker behind it is dead — so both stay warm in exactly the failure
this net exists for. Folding them in would mean nothing ever destroys a wedged, billing
machine. Neither channel appears in this module.

The threshold has a hard floor (:data:`FLOOR`): a setting below it is raised to it, with a
warning, so a misconfiguration cannot shrink it into something that kills healthy machines
mid-request. A machine that never reported in this life is not this net's (boot failure
owns it; see :mod:`gpufleet.reaper.lifetime`); an exempt workload class is refused by
class, never by a longer timeout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, case

from gpufleet.common.db.enums import RUNNING_STATES
from gpufleet.common.db.models import Machine
from gpufleet.common.ledger import FailureClass
from gpufleet.reaper.detection_latency import last_report
from gpufleet.reaper.lifetime import reported_this_life, reported_this_life_sql
from gpufleet.reaper.net_runner import Claim, OneStepNet, OneStepSpec, due_by
from gpufleet.reaper.refusal import MachineSnapshot, NetGates, Refuse, first_refusal
from gpufleet.reaper.snapshot import state_in
from gpufleet.reaper.transition import destroy_transition

log = logging.getLogger(__name__)

NAME = "went_silent"
DESTROY = destroy_transition(NAME)
FLOOR = timedelta(minutes=5)


def floored(silent_after: timedelta) -> timedelta:
    """``silent_after``, raised to :data:`FLOOR` (with a warning) when set below it."""
    if silent_after < FLOOR:
        log.warning(
            "went-silent threshold %ss is below the hard floor; using %ss",
            silent_after.total_seconds(),
            FLOOR.total_seconds(),
            extra={
                "fields": {"configured_s": silent_after.total_seconds(), "floor_s": FLOOR.total_seconds()}
            },
        )
        return FLOOR
    return silent_after


@dataclass(frozen=True)
class WentSilentPolicy:
    silent_after: timedelta = timedelta(minutes=15)
    grace: timedelta = timedelta(minutes=10)

    def __post_init__(self) -> None:
        # The floor holds however the policy is built, not only through Settings.
        object.__setattr__(self, "silent_after", floored(self.silent_after))

    @property
    def gates(self) -> NetGates:
        return NetGates(net=NAME, grace=self.grace, reads_reports=True)


@dataclass(frozen=True)
class DestroyMachine:
    machine_id: str
    details: str


def decide(
    now: datetime, machine: MachineSnapshot, policy: WentSilentPolicy
) -> DestroyMachine | Refuse | None:
    """Destroy, refuse (naming the gate), or nothing to do (reporting, or not this net's)."""
    if not is_due(now, machine, policy):
        return None
    assert machine.worker_report_at is not None
    silent_for = now - machine.worker_report_at
    reason = first_refusal(now, machine, policy.gates)
    if reason is not None:
        return Refuse(reason)
    return DestroyMachine(
        machine.machine_id,
        f"the worker last reported at {machine.worker_report_at.isoformat()}, "
        f"{int(silent_for.total_seconds())}s ago (threshold {int(policy.silent_after.total_seconds())}s)",
    )


def running_report_clock() -> ColumnElement[datetime | None]:
    """``worker_report_at`` of a running machine, NULL for any other: the expression
    ``ix_machines_running_report_clock`` indexes (and keeps statistics on)."""
    return case((state_in(RUNNING_STATES), Machine.worker_report_at))


def due(now: datetime, policy: WentSilentPolicy) -> list[ColumnElement[bool]]:
    """The scan's WHERE: running, reported this life, and silent at least ``silent_after``.

    ix_machines_running_report_clock: a range over the running machines' report clock
    reads only the silent ones; healthy ones report every few seconds, outside it.
    """
    return [
        state_in(RUNNING_STATES),
        running_report_clock() <= now - policy.silent_after,
        reported_this_life_sql(),
    ]


def due_at(machine: MachineSnapshot, policy: WentSilentPolicy) -> datetime | None:
    """``silent_after`` past its last report, while it runs and has reported this life."""
    if machine.state not in RUNNING_STATES or not reported_this_life(machine):
        return None
    if machine.worker_report_at is None:
        return None
    return machine.worker_report_at + policy.silent_after


def is_due(now: datetime, machine: MachineSnapshot, policy: WentSilentPolicy) -> bool:
    """:func:`due` over a snapshot."""
    return due_by(due_at(machine, policy), now)


def claim(now: datetime, machine: MachineSnapshot, act: DestroyMachine, policy: WentSilentPolicy) -> Claim:
    return Claim(
        # Still silent: a report that arrived since the scan cancels the destroy.
        guards=[*due(now, policy), Machine.worker_report_at == machine.worker_report_at],
        clear_at_end=[Machine.stop_due_at, Machine.destroy_due_at],
        details=act.details,
        first_sign=last_report(machine),
    )


SPEC = OneStepSpec(
    name=NAME,
    transition=DESTROY,
    detects=FailureClass.WENT_SILENT,
    due=due,
    due_at=due_at,
    decide=decide,
    acts=DestroyMachine,
    claim=claim,
)


class WentSilent(OneStepNet[WentSilentPolicy, DestroyMachine]):
    spec = SPEC
