"""Stuck transition: a machine too long in a transitional state gets a fresh provider read
(DESIGN §4, every 60 s).

PROVISIONING, STARTING, STOPPING and DESTROYING are where a provider call that failed (or
never answered) leaves a machine — visible, never silently back in the pool. This net
reads what the provider says now and compares it with the recorded **intent**:

- the provider agrees (intent RUNNING and the instance is running or starting; STOPPED
  and it is stopped; DESTROYED and it is gone) → the transition is finished in the record;
- otherwise → one ledger row (``transition_stuck``, routed to ALERT_HUMAN, so an incident
  opens) per stuck transition, and the machine stays where it is for a human.

It never repeats the provider call that failed: a silent retry of a call whose first
outcome is unknown is how a platform stops or destroys the wrong thing twice. It reads
(``get``) and records, nothing more.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy import ColumnElement, exists, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import lifecycle
from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import TRANSITIONAL_STATES, MachineIntent, MachineState
from gpufleet.common.db.models import Failure, Machine
from gpufleet.common.errors import GpufleetError
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, OutcomePolicy, record_failure
from gpufleet.common.loops import TickReport
from gpufleet.common.provider_errors import InstanceNotFound
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.refusal import MachineSnapshot, RefusalReason, Refuse, is_ours
from gpufleet.reaper.snapshot import not_destroyed, ours, scan, state_in
from gpufleet.v1 import machine_pb2, provisioner_service_pb2

log = logging.getLogger(__name__)

NAME = "stuck_transition"
GONE = "GONE"


class InstanceReader(Protocol):
    """The one provisioner call this net makes (``ProvisionerClient`` satisfies it).

    Raises ``InstanceNotFound`` when the instance does not exist.
    """

    def get(
        self, machine_id: str, offering: machine_pb2.Offering, provider_instance_id: str
    ) -> provisioner_service_pb2.Instance: ...


@dataclass(frozen=True)
class ProviderView:
    """A fresh provider read: ``status`` is RUNNING/PENDING/STOPPING/STOPPED/TERMINATED, or
    GONE when the provider has no such instance; ``error`` when it could not be read."""

    status: str = ""
    provider_instance_id: str = ""
    agent_address: str = ""
    error: str | None = None


@dataclass(frozen=True)
class StuckPolicy:
    stuck_after: timedelta = timedelta(minutes=10)


@dataclass(frozen=True)
class ReadProvider:
    machine_id: str


@dataclass(frozen=True)
class FinishTransition:
    """The provider agrees with the intent: record the end state."""

    end: MachineState
    provider_instance_id: str = ""
    agent_address: str = ""


@dataclass(frozen=True)
class AlertStuck:
    details: str


# What each intent's end state is, and which provider statuses agree with it.
_AGREES: dict[str, tuple[MachineState, frozenset[str]]] = {
    MachineIntent.RUNNING.value: (MachineState.BOOTING, frozenset({"RUNNING", "PENDING"})),
    MachineIntent.STOPPED.value: (MachineState.STOPPED, frozenset({"STOPPED"})),
    MachineIntent.DESTROYED.value: (MachineState.DESTROYED, frozenset({GONE, "TERMINATED"})),
}


def gate(now: datetime, machine: MachineSnapshot, policy: StuckPolicy) -> ReadProvider | Refuse | None:
    if machine.state not in TRANSITIONAL_STATES or machine.state_changed_at is None:
        return None
    if now - machine.state_changed_at < policy.stuck_after:
        return None
    if not is_ours(machine):
        return Refuse(RefusalReason.NOT_OURS)
    return ReadProvider(machine.machine_id)


def decide(
    now: datetime, machine: MachineSnapshot, view: ProviderView, policy: StuckPolicy
) -> FinishTransition | AlertStuck | Refuse | None:
    """Finish, alert, or refuse for want of a provider answer."""
    gated = gate(now, machine, policy)
    if not isinstance(gated, ReadProvider):
        return gated
    if view.error is not None:
        return Refuse(RefusalReason.PROVIDER_UNREADABLE)
    assert machine.state_changed_at is not None
    since = f"{machine.state} since {machine.state_changed_at.isoformat()}"
    agrees = _AGREES.get(machine.intent)
    if agrees is None:
        return AlertStuck(
            f"{since} with an intent nobody knows ({machine.intent}); provider says {view.status}"
        )
    end, statuses = agrees
    if not lifecycle.allowed(MachineState(machine.state), end, lifecycle.Actor.REAPER):
        return AlertStuck(
            f"{since} with intent {machine.intent}, which the lifecycle cannot finish "
            f"(no move to {end.value}); provider says {view.status or 'nothing'}; left for a human"
        )
    if view.status in statuses:
        return FinishTransition(end, view.provider_instance_id, view.agent_address)
    return AlertStuck(
        f"{since}: intent {machine.intent} but the provider says {view.status or 'nothing'}; "
        "left as it is for a human (the call is never retried silently)"
    )


def read_provider(reader: InstanceReader, machine: MachineSnapshot) -> ProviderView:
    """One fresh ``get``, with no transaction open."""
    try:
        instance = reader.get(
            machine.machine_id, machine.offering or machine_pb2.Offering(), machine.provider_instance_id or ""
        )
    except InstanceNotFound:
        return ProviderView(status=GONE)
    except GpufleetError as err:
        return ProviderView(error=f"{getattr(err, 'kind', type(err).__name__)}: {err}")
    except Exception as err:
        log.exception("unexpected error reading %s from the provider", machine.machine_id)
        return ProviderView(error=str(err))
    status = provisioner_service_pb2.InstanceStatus.Name(instance.status).removeprefix("INSTANCE_STATUS_")
    return ProviderView(
        status=status,
        provider_instance_id=instance.provider_instance_id,
        agent_address=instance.agent_address,
    )


class StuckTransition:
    name = NAME

    def __init__(
        self,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        clock: Clock,
        reader: InstanceReader,
        policy: StuckPolicy,
        outcomes: OutcomePolicy | None = None,
    ) -> None:
        self.sessions = sessions
        self.lease = lease
        self.clock = clock
        self.reader = reader
        self.policy = policy
        self.outcomes = outcomes or OutcomePolicy()

    def due(self, now: datetime) -> list[ColumnElement[bool]]:
        # ix_machines_transitional: only machines in a transitional state are read.
        return [state_in(TRANSITIONAL_STATES), Machine.state_changed_at <= now - self.policy.stuck_after]

    def scan(self, now: datetime) -> list[MachineSnapshot]:
        with self.sessions() as session:
            return scan(session, self.due(now))

    def run(self, now: datetime) -> TickReport:
        decisions = DecisionLog(NAME)
        for machine in self.scan(now):
            gated = gate(now, machine, self.policy)
            if isinstance(gated, Refuse):
                decisions.refused(machine.machine_id, gated.reason)
                continue
            if gated is None:
                continue
            view = read_provider(self.reader, machine)
            decision = decide(now, machine, view, self.policy)
            if isinstance(decision, Refuse):
                decisions.refused(machine.machine_id, decision.reason, view.error or "")
            elif isinstance(decision, FinishTransition):
                if self._finish(machine, decision, view):
                    decisions.acted(machine.machine_id, "finish", f"{machine.state} -> {decision.end.value}")
                else:
                    decisions.refused(machine.machine_id, RefusalReason.CHANGED_SINCE_SCAN)
            elif isinstance(decision, AlertStuck):
                if self._alert(machine, decision):
                    decisions.acted(machine.machine_id, "alert", decision.details, level=logging.WARNING)
                else:
                    decisions.acted(machine.machine_id, "still_stuck", level=logging.DEBUG)
        return decisions.report

    def _finish(self, machine: MachineSnapshot, finish: FinishTransition, view: ProviderView) -> bool:
        now = self.clock.now()
        values: dict[str, object] = {}
        if finish.end is MachineState.BOOTING:
            # Seen running now: its boot window (and first observation) start here.
            values["first_observed_at"] = now
            if finish.provider_instance_id:
                values["provider_instance_id"] = finish.provider_instance_id
            if finish.agent_address:
                values["agent_address"] = finish.agent_address
        elif finish.end is MachineState.STOPPED:
            values["stop_due_at"] = None
        elif finish.end is MachineState.DESTROYED:
            values["stop_due_at"] = None
            values["destroy_due_at"] = None
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            return lifecycle.transition(
                session,
                machine.machine_id,
                MachineState(machine.state),
                finish.end,
                by=lifecycle.Actor.REAPER,
                why=f"{NAME}: the provider says {view.status}, as intent {machine.intent} wants",
                now=now,
                where=[
                    Machine.state_changed_at == machine.state_changed_at,
                    Machine.intent == machine.intent,
                    not_destroyed(),
                    *ours(),
                ],
                **values,
            )

    def _alert(self, machine: MachineSnapshot, alert: AlertStuck) -> bool:
        """One ledger row (and incident) per stuck transition; False when already alerted."""
        assert machine.state_changed_at is not None
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            alerted = session.execute(
                select(
                    exists().where(
                        Failure.machine_id == machine.machine_id,
                        Failure.failure_class == FailureClass.TRANSITION_STUCK.value,
                        Failure.at >= machine.state_changed_at,
                    )
                )
            ).scalar()
            if alerted:
                return False
            record_failure(
                session,
                self.clock.now(),
                FailureClass.TRANSITION_STUCK.value,
                NAME,
                machine_id=machine.machine_id,
                details=alert.details,
                incident_key=(
                    f"{FailureClass.TRANSITION_STUCK.value}:{machine.machine_id}:"
                    f"{machine.state}:{machine.state_changed_at.isoformat()}"
                ),
                apply=True,
                policy=self.outcomes,
            )
            return True
