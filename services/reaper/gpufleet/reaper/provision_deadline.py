"""Provision deadline: a machine that never made contact by the deadline fixed when it was
requested is destroyed (DESIGN §4, every 60 s).

Its question is the one no staleness check can ask: a machine that never registered has
no report to go stale from, so its silence looks the same on the first tick and the
thousandth. The deadline is ``provision_deadline_at``, written by the scheduler when it
placed the request (``requested_at`` plus the configured fallback for a row that has none)
— never moved, never counted from anything the provider says.

"Never made contact" means neither channel the machine itself answers on was ever warm:
no successful probe of its agent, no report from its worker. A machine that made contact
but never reported belongs to the boot-failure net, whose window runs from first
observation. No grace window: the deadline already runs from the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, or_

from gpufleet.common.db.enums import MachineState
from gpufleet.common.db.models import Machine
from gpufleet.common.ledger import FailureClass
from gpufleet.reaper.detection_latency import provision_requested
from gpufleet.reaper.net_runner import Claim, OneStepNet, OneStepSpec, due_by
from gpufleet.reaper.refusal import MachineSnapshot, NetGates, Refuse, first_refusal
from gpufleet.reaper.snapshot import state_in
from gpufleet.reaper.transition import destroy_transition

NAME = "provision_deadline"
DESTROY = destroy_transition(NAME)

# Being created, or created and not yet heard from.
PRE_CONTACT_STATES = frozenset({MachineState.PROVISIONING, MachineState.BOOTING})


@dataclass(frozen=True)
class ProvisionDeadlinePolicy:
    # Only for a row with no provision_deadline_at: counted from requested_at.
    default_deadline: timedelta = timedelta(minutes=20)

    @property
    def gates(self) -> NetGates:
        return NetGates(net=NAME, grace=timedelta(0), reads_reports=False)


@dataclass(frozen=True)
class DestroyMachine:
    machine_id: str
    details: str


def deadline_of(machine: MachineSnapshot, policy: ProvisionDeadlinePolicy) -> datetime | None:
    if machine.provision_deadline_at is not None:
        return machine.provision_deadline_at
    if machine.requested_at is not None:
        return machine.requested_at + policy.default_deadline
    return None


def never_contacted(machine: MachineSnapshot) -> bool:
    return machine.probe_ok_at is None and machine.worker_report_at is None


def decide(
    now: datetime, machine: MachineSnapshot, policy: ProvisionDeadlinePolicy
) -> DestroyMachine | Refuse | None:
    """Destroy, refuse (naming the gate), or nothing to do (made contact, or not yet due)."""
    if not is_due(now, machine, policy):
        return None
    deadline = deadline_of(machine, policy)
    assert deadline is not None
    reason = first_refusal(now, machine, policy.gates)
    if reason is not None:
        return Refuse(reason)
    return DestroyMachine(
        machine.machine_id,
        f"no contact by its provision deadline {deadline.isoformat()} (requested "
        f"{machine.requested_at.isoformat() if machine.requested_at else '?'}, still {machine.state})",
    )


def due(now: datetime, policy: ProvisionDeadlinePolicy) -> list[ColumnElement[bool]]:
    """The scan's WHERE: not yet heard from, and past its deadline
    (ix_machines_pre_contact_deadline: only machines not yet heard from are read)."""
    return [
        state_in(PRE_CONTACT_STATES),
        Machine.probe_ok_at.is_(None),
        Machine.worker_report_at.is_(None),
        or_(
            Machine.provision_deadline_at <= now,
            and_(
                Machine.provision_deadline_at.is_(None),
                Machine.requested_at <= now - policy.default_deadline,
            ),
        ),
    ]


def due_at(machine: MachineSnapshot, policy: ProvisionDeadlinePolicy) -> datetime | None:
    """Its deadline, while it is on its way and not yet heard from."""
    if machine.state not in PRE_CONTACT_STATES or not never_contacted(machine):
        return None
    return deadline_of(machine, policy)


def is_due(now: datetime, machine: MachineSnapshot, policy: ProvisionDeadlinePolicy) -> bool:
    """:func:`due` over a snapshot."""
    return due_by(due_at(machine, policy), now)


def claim(
    now: datetime, machine: MachineSnapshot, act: DestroyMachine, policy: ProvisionDeadlinePolicy
) -> Claim:
    return Claim(
        guards=due(now, policy),
        clear_at_end=[Machine.stop_due_at, Machine.destroy_due_at],
        details=act.details,
        first_sign=provision_requested(machine, policy.default_deadline),
    )


SPEC = OneStepSpec(
    name=NAME,
    transition=DESTROY,
    detects=FailureClass.PROVISION_TIMEOUT,
    due=due,
    due_at=due_at,
    decide=decide,
    acts=DestroyMachine,
    claim=claim,
)


class ProvisionDeadline(OneStepNet[ProvisionDeadlinePolicy, DestroyMachine]):
    spec = SPEC
