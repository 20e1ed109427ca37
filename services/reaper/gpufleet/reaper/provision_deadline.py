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

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, or_
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool
from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import MachineState
from gpufleet.common.db.models import Machine
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, OutcomePolicy
from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.detection_latency import provision_requested
from gpufleet.reaper.refusal import MachineSnapshot, NetGates, Refuse, first_refusal
from gpufleet.reaper.snapshot import scan, state_in
from gpufleet.reaper.transition import Detection, MachineProvider, TransitionRunner, destroy_transition

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
    if machine.state not in PRE_CONTACT_STATES or not never_contacted(machine):
        return None
    deadline = deadline_of(machine, policy)
    if deadline is None or now < deadline:
        return None
    reason = first_refusal(now, machine, policy.gates)
    if reason is not None:
        return Refuse(reason)
    return DestroyMachine(
        machine.machine_id,
        f"no contact by its provision deadline {deadline.isoformat()} (requested "
        f"{machine.requested_at.isoformat() if machine.requested_at else '?'}, still {machine.state})",
    )


class ProvisionDeadline:
    name = NAME

    def __init__(
        self,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        clock: Clock,
        provider: MachineProvider,
        policy: ProvisionDeadlinePolicy,
        outcomes: OutcomePolicy | None = None,
        *,
        calls: CallPool | None = None,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.provider = provider
        self.policy = policy
        self.instruments = instruments
        self.runner = TransitionRunner(sessions, lease, clock, outcomes, calls=calls, instruments=instruments)

    def due(self, now: datetime) -> list[ColumnElement[bool]]:
        # ix_machines_pre_contact_deadline: only machines not yet heard from are read.
        return [
            state_in(PRE_CONTACT_STATES),
            Machine.probe_ok_at.is_(None),
            Machine.worker_report_at.is_(None),
            or_(
                Machine.provision_deadline_at <= now,
                and_(
                    Machine.provision_deadline_at.is_(None),
                    Machine.requested_at <= now - self.policy.default_deadline,
                ),
            ),
        ]

    def scan(self, now: datetime) -> list[MachineSnapshot]:
        with self.sessions() as session:
            return scan(session, self.due(now))

    def run(self, now: datetime) -> TickReport:
        decisions = DecisionLog(NAME, self.runner.answered(), self.instruments)
        self.act(now, self.scan(now), decisions)
        return decisions.report

    def act(self, now: datetime, machines: Sequence[MachineSnapshot], decisions: DecisionLog) -> None:
        """Decide and apply for what one scan read (each claim re-checks the row)."""
        for machine in machines:
            decision = decide(now, machine, self.policy)
            if isinstance(decision, Refuse):
                decisions.refused(machine.machine_id, decision.reason)
            elif isinstance(decision, DestroyMachine):
                self.runner.execute(
                    DESTROY,
                    machine,
                    now,
                    decisions,
                    guards=self.due(now),
                    clear_at_end=[Machine.stop_due_at, Machine.destroy_due_at],
                    call=self.provider.destroy,
                    detection=Detection(FailureClass.PROVISION_TIMEOUT, decision.details),
                    first_sign=provision_requested(machine, self.policy.default_deadline),
                )
