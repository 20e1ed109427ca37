"""Stuck transition: a machine too long in a transitional state gets a fresh provider read
(DESIGN §4, every 60 s).

PROVISIONING, STARTING, STOPPING and DESTROYING are where a provider call that failed (or
never answered) leaves a machine — visible, never silently back in the pool. This net
reads what the provider says now and compares it with the recorded **intent**:

- the provider agrees (intent RUNNING and the instance is running or starting; STOPPED
  and it is stopped; DESTROYED and it is gone) → the transition is finished in the record;
- the intent is STOPPED or DESTROYED and the provider says the instance still runs (the
  stop or destroy failed, or its answer was lost before it took effect) → the call is
  **re-issued**, visibly: a ``transition_reissued`` row goes to the ledger in the same
  compare-and-set transaction that checks the row has not moved, and only then is the
  call made — the same call, with the same idempotency key as the first (its
  ``request_id`` is read from when the transition began), and stop and destroy are
  idempotent at the provider (stopping a stopped instance or destroying a gone one does
  nothing). A re-issued destroy walks the refusal ladder like any other. At most
  ``reissues`` times, ``reissue_every`` apart;
- otherwise, or once the re-issues are spent → one ledger row (``transition_stuck``,
  routed to ALERT_HUMAN, so an incident opens) per stuck transition, and the machine stays
  where it is for a human.

A destroy the provider accepted but has not confirmed (a ``destroy_unconfirmed`` row since
the transition began: EC2 still shutting the instance down, a GCE delete still running) is
read on every pass, not only once stuck: the moment the provider shows it gone, the machine
is DESTROYED; until then it stays DESTROYING, and once ``stuck_after`` passes the rules
above apply to it like any other (a re-issue, then a human).

A machine whose stop or destroy is still in flight in this reaper's provider-call pool
(a slow call, or one waiting for a worker) is not stuck but slow: it is left to that call
— no read, no re-issue — so the same call is never out twice from here.

Why re-issue at all: a stop whose answer was lost leaves an instance billing with nothing
on it until a human answers the incident — an hour of GPU time for a call that is safe to
repeat (the simulator's month measured that as most of the gap between the nets and the
oracle). What the seed forbids is a *silent* retry; this one is recorded first, bounded,
and leaves the human the case it cannot settle. A create or start is never re-issued: a
second create is a second bill.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from opentelemetry import context as otel_context
from sqlalchemy import ColumnElement, and_, exists, or_, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import lifecycle
from gpufleet.common.calls import CallPool, Outcomes
from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import TRANSITIONAL_STATES, MachineIntent, MachineState
from gpufleet.common.db.models import Failure, Machine
from gpufleet.common.errors import GpufleetError
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, OutcomePolicy, record_failure
from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.provider_errors import InstanceNotFound, NotYetDone
from gpufleet.common.telemetry import tracer
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.detection_latency import DetectionLatency, transition_start
from gpufleet.reaper.net_runner import due_by
from gpufleet.reaper.refusal import MachineSnapshot, NetGates, RefusalReason, Refuse, first_refusal, is_ours
from gpufleet.reaper.snapshot import no_live_attempt, not_destroyed, ours, scan, state_in
from gpufleet.reaper.transition import MachineProvider, record_unconfirmed, request_id
from gpufleet.v1 import machine_pb2, provisioner_service_pb2

log = logging.getLogger(__name__)
_tracer = tracer("gpufleet.reaper")

NAME = "stuck_transition"
GONE = "GONE"


class InstanceReader(Protocol):
    """The one provisioner call this net makes (``ProvisionerClient`` satisfies it).

    Raises ``InstanceNotFound`` when the instance does not exist.
    """

    def get(
        self, machine_id: str, offering: machine_pb2.Offering, provider_instance_id: str
    ) -> provisioner_service_pb2.Instance: ...


class StuckProvider(InstanceReader, MachineProvider, Protocol):
    """A fresh read, and the two calls the net may re-issue (never a create or a start)."""


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
    # How often a stop or destroy the provider has not carried out is sent again, and how
    # long after the last one the net waits (it may still be under way) before the next
    # read may re-issue or alert.
    reissues: int = 2
    reissue_every: timedelta = timedelta(minutes=5)


@dataclass(frozen=True)
class ReadProvider:
    machine_id: str


@dataclass(frozen=True)
class FinishTransition:
    """The provider agrees with the intent: record the end state."""

    end: MachineState
    provider_instance_id: str = ""
    agent_address: str = ""


def finish_values(finish: FinishTransition, machine: MachineSnapshot, now: datetime) -> dict[str, object]:
    """The columns a finished transition writes beside its state, decided once (the net's
    writer and the simulator apply them): a stopped machine has no stop timer left, a
    destroyed one no timer at all; one seen running takes the instance and address the
    provider gave, and its boot window (``first_observed_at``) starts when this platform
    first saw this life running. A create or start whose answer was lost is often listed or
    probed running long before the net finishes it, and the column — empty from the create
    or the start's intent until this life is seen — kept that sighting: it stands (else
    now). Restarting the window here let a hung boot run up to ``stuck_after`` past it."""
    if finish.end is MachineState.BOOTING:
        values: dict[str, object] = {"first_observed_at": machine.first_observed_at or now}
        if finish.provider_instance_id:
            values["provider_instance_id"] = finish.provider_instance_id
        if finish.agent_address:
            values["agent_address"] = finish.agent_address
        return values
    if finish.end is MachineState.STOPPED:
        return {"stop_due_at": None}
    if finish.end is MachineState.DESTROYED:
        return {"stop_due_at": None, "destroy_due_at": None}
    return {}


@dataclass(frozen=True)
class ReissueCall:
    """Send the intent's call again: ``operation`` is ``stop`` or ``destroy``."""

    operation: str
    end: MachineState
    details: str


@dataclass(frozen=True)
class AlertStuck:
    details: str


# What each intent's end state is, and which provider statuses agree with it.
_AGREES: dict[str, tuple[MachineState, frozenset[str]]] = {
    MachineIntent.RUNNING.value: (MachineState.BOOTING, frozenset({"RUNNING", "PENDING"})),
    MachineIntent.STOPPED.value: (MachineState.STOPPED, frozenset({"STOPPED"})),
    MachineIntent.DESTROYED.value: (MachineState.DESTROYED, frozenset({GONE, "TERMINATED"})),
}
# The calls the net may re-issue: per intent, the call, the states it may be re-issued
# from, and the provider statuses that say it has not been carried out. A stop is sent to
# a running instance only (a pending one cannot be stopped yet, a stopping one is under
# way); a destroy to any instance that still exists.
_REISSUE: dict[str, tuple[str, frozenset[str], frozenset[str]]] = {
    MachineIntent.STOPPED.value: ("stop", frozenset({MachineState.STOPPING.value}), frozenset({"RUNNING"})),
    MachineIntent.DESTROYED.value: (
        "destroy",
        frozenset({MachineState.STOPPING.value, MachineState.DESTROYING.value}),
        frozenset({"RUNNING", "PENDING", "STOPPING", "STOPPED"}),
    ),
}
# A re-issued stop or destroy walks the ladder; no grace window, and no report is read.
_GATES = NetGates(net=NAME)


def due_at(machine: MachineSnapshot, policy: StuckPolicy, unconfirmed: bool = False) -> datetime | None:
    """When the net first reads the machine, nothing changing (its requeue-after): a
    transition ``stuck_after`` old — or, for a destroy awaiting the provider's confirmation
    (``unconfirmed``), at once, on every pass; None for a machine in no transition."""
    if machine.state not in TRANSITIONAL_STATES or machine.state_changed_at is None:
        return None
    if unconfirmed and machine.state == MachineState.DESTROYING.value:
        return machine.state_changed_at
    return machine.state_changed_at + policy.stuck_after


def gate(
    now: datetime, machine: MachineSnapshot, policy: StuckPolicy, unconfirmed: bool = False
) -> ReadProvider | Refuse | None:
    """Read the provider for a machine stuck in a transitional state, or — ``unconfirmed``
    — for a DESTROYING machine whose destroy awaits the provider's confirmation."""
    if not due_by(due_at(machine, policy, unconfirmed), now):
        return None
    if not is_ours(machine):
        return Refuse(RefusalReason.NOT_OURS)
    return ReadProvider(machine.machine_id)


def decide(
    now: datetime,
    machine: MachineSnapshot,
    view: ProviderView,
    policy: StuckPolicy,
    reissued: Sequence[datetime] = (),
    unconfirmed: bool = False,
) -> FinishTransition | ReissueCall | AlertStuck | Refuse | None:
    """Finish, re-issue, alert, or refuse for want of a provider answer. ``reissued`` is
    when this transition's call was re-issued so far (from the ledger); ``unconfirmed``,
    whether its destroy awaits the provider's confirmation (a ``destroy_unconfirmed`` row)."""
    gated = gate(now, machine, policy, unconfirmed)
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
    if not due_by(due_at(machine, policy), now):
        return None  # a destroy accepted and not confirmed yet: read again next pass
    if reissued and now - max(reissued) < policy.reissue_every:
        return None  # the call just re-issued may still be under way
    reissue = _REISSUE.get(machine.intent)
    if reissue is not None and machine.state in reissue[1] and view.status in reissue[2]:
        operation = reissue[0]
        refusal = first_refusal(now, machine, _GATES)
        if refusal is not None:
            return Refuse(refusal)
        if len(reissued) < policy.reissues:
            return ReissueCall(
                operation,
                end,
                f"{since}: intent {machine.intent} but the provider says {view.status}; "
                f"{operation} re-issued ({len(reissued) + 1} of {policy.reissues}), same request id",
            )
        return AlertStuck(
            f"{since}: intent {machine.intent} but the provider still says {view.status} after "
            f"{len(reissued)} re-issued {operation}s; left as it is for a human"
        )
    return AlertStuck(
        f"{since}: intent {machine.intent} but the provider says {view.status or 'nothing'}; "
        "left as it is for a human (only a stop or destroy of an instance that still exists is re-issued)"
    )


def this_transition(machine: MachineSnapshot, at: Iterable[datetime]) -> list[datetime]:
    """Of the machine's ledger rows of one class (when each was written), those its present
    transition met: written at or after the transition began. The re-issues counted
    against ``reissues`` and the one incident a transition opens are the present
    transition's — a machine that moves on and is stuck again starts afresh. The reaper
    reads the rows from the ledger and the simulator keeps the ones it wrote; both judge
    them here."""
    began = machine.state_changed_at
    if began is None:
        return []
    return [t for t in at if t >= began]


def opens_incident(machine: MachineSnapshot, stuck_rows: Iterable[datetime]) -> bool:
    """Whether an :class:`AlertStuck` writes its ``transition_stuck`` row (which opens the
    incident): once per stuck transition — none of ``stuck_rows``, the machine's rows of
    that class so far, is this transition's. The net reads a stuck machine every pass; a
    human is paged once."""
    return not this_transition(machine, stuck_rows)


def finish_where(read: MachineSnapshot) -> list[ColumnElement[bool]]:
    """A finish's compare-and-set, beside the state it moves from: the row is still in the
    transition the net read (same start, same intent), not destroyed, and ours. A finish
    that comes after the row moved on — the first call's own answer ended it, or a human
    did — writes nothing."""
    return [
        Machine.state_changed_at == read.state_changed_at,
        Machine.intent == read.intent,
        not_destroyed(),
        *ours(),
    ]


def finish_holds(read: MachineSnapshot, row: MachineSnapshot) -> bool:
    """:func:`finish_where` (and the state it moves from) over a snapshot of the row now."""
    return (
        row.state == read.state
        and row.state_changed_at == read.state_changed_at
        and row.intent == read.intent
        and row.state != MachineState.DESTROYED.value
        and is_ours(row)
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
        provider: StuckProvider,
        policy: StuckPolicy,
        outcomes: OutcomePolicy | None = None,
        *,
        calls: CallPool | None = None,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.lease = lease
        self.clock = clock
        self.provider = provider
        self.policy = policy
        self.outcomes = outcomes or OutcomePolicy()
        self.instruments = instruments
        # Each act on a stuck transition (a re-issue, a finish, an alert) is measured from
        # the transition's start: how long the machine sat there before this net moved.
        self.latency = DetectionLatency(NAME, instruments)
        # The pool the other nets' stops and destroys run in: a re-issue runs there too, and
        # a machine whose call is still in flight there is left to that call.
        self.calls = calls or CallPool(16, "provider-calls")
        self.answers = Outcomes()

    def due(self, now: datetime) -> list[ColumnElement[bool]]:
        # ix_machines_transitional: only machines in a transitional state are read.
        awaiting_confirmation = and_(
            Machine.state == MachineState.DESTROYING.value,
            exists().where(
                Failure.machine_id == Machine.id,
                Failure.failure_class == FailureClass.DESTROY_UNCONFIRMED.value,
                Failure.at >= Machine.state_changed_at,
            ),
        )
        return [
            state_in(TRANSITIONAL_STATES),
            or_(Machine.state_changed_at <= now - self.policy.stuck_after, awaiting_confirmation),
        ]

    def scan(self, now: datetime) -> list[MachineSnapshot]:
        with self.sessions() as session:
            return scan(session, self.due(now))

    def run(self, now: datetime) -> TickReport:
        decisions = DecisionLog(NAME, self.answers.take(), self.instruments)
        machines = self.scan(now)
        reissued = self._since_transition(machines, FailureClass.TRANSITION_REISSUED)
        unconfirmed = self._since_transition(machines, FailureClass.DESTROY_UNCONFIRMED)
        for machine in machines:
            awaiting = machine.machine_id in unconfirmed
            gated = gate(now, machine, self.policy, awaiting)
            if isinstance(gated, Refuse):
                decisions.refused(machine.machine_id, gated.reason)
                continue
            if gated is None:
                continue
            if self.calls.busy(machine.machine_id):
                # Its stop or destroy is still out (or waiting for a worker) here: not stuck
                # but slow, and that call records its own answer — a re-issue now would be
                # the same call twice.
                decisions.acted(machine.machine_id, "call_in_flight", level=logging.DEBUG)
                continue
            view = read_provider(self.provider, machine)
            decision = decide(now, machine, view, self.policy, reissued.get(machine.machine_id, ()), awaiting)
            if decision is None and awaiting:
                decisions.acted(machine.machine_id, "destroy_awaiting_confirmation", view.status)
            elif isinstance(decision, Refuse):
                decisions.refused(machine.machine_id, decision.reason, view.error or "")
            elif isinstance(decision, ReissueCall):
                self._reissue(machine, decision, decisions)
            elif isinstance(decision, FinishTransition):
                why = f"{NAME}: the provider says {view.status}, as intent {machine.intent} wants"
                if self._finish(machine, decision, why=why):
                    decisions.acted(machine.machine_id, "finish", f"{machine.state} -> {decision.end.value}")
                    self.latency.acted(transition_start(machine), now)
                else:
                    decisions.refused(machine.machine_id, RefusalReason.CHANGED_SINCE_SCAN)
            elif isinstance(decision, AlertStuck):
                if self._alert(machine, decision):
                    decisions.acted(machine.machine_id, "alert", decision.details, level=logging.WARNING)
                    self.latency.acted(transition_start(machine), now)
                else:
                    decisions.acted(machine.machine_id, "still_stuck", level=logging.DEBUG)
        return decisions.report

    def _since_transition(
        self, machines: Sequence[MachineSnapshot], failure_class: FailureClass
    ) -> dict[str, list[datetime]]:
        """When each scanned machine's present transition met ``failure_class`` so far (its
        re-issues, its unconfirmed destroys): those rows since the transition began, one
        query for the scan."""
        ids = [m.machine_id for m in machines if m.state_changed_at is not None]
        if not ids:
            return {}
        at: dict[str, list[datetime]] = {}
        with self.sessions() as session:
            rows = session.execute(
                select(Failure.machine_id, Failure.at).where(
                    Failure.failure_class == failure_class.value,
                    Failure.machine_id.in_(ids),
                )
            ).all()
        for machine_id, when in rows:
            if machine_id is not None:
                at.setdefault(machine_id, []).append(when)
        out: dict[str, list[datetime]] = {}
        for machine in machines:
            met = this_transition(machine, at.get(machine.machine_id, ()))
            if met:
                out[machine.machine_id] = met
        return out

    def _reissue(self, machine: MachineSnapshot, call: ReissueCall, decisions: DecisionLog) -> None:
        """Record, then call, then finish: the ledger row is committed in the transaction
        that checks the row is as the scan saw it, before the provider hears anything; the
        call and its outcome run in the provider-call pool."""
        assert machine.state_changed_at is not None
        if not self.calls.accepting:
            log.info("the reaper is stopping: %s of %s not re-issued", call.operation, machine.machine_id)
            return
        at = self.clock.now()
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            still = session.execute(
                select(Machine.id)
                .where(
                    Machine.id == machine.machine_id,
                    Machine.state == machine.state,
                    Machine.intent == machine.intent,
                    Machine.state_changed_at == machine.state_changed_at,
                    not_destroyed(),
                    no_live_attempt(),
                    *ours(),
                )
                .with_for_update()
            ).scalar_one_or_none()
            if still is None:
                decisions.refused(machine.machine_id, RefusalReason.CHANGED_SINCE_SCAN)
                return
            record_failure(
                session,
                at,
                FailureClass.TRANSITION_REISSUED.value,
                NAME,
                machine_id=machine.machine_id,
                details=call.details,
                apply=True,
                policy=self.outcomes,
            )
        # The re-issue is recorded (committed): the act, whatever the call then answers.
        self.latency.acted(transition_start(machine), at)
        # The first call's key: a provider that saw it treats this as its replay.
        key = request_id(call.operation, machine.machine_id, machine.state_changed_at)
        sent = functools.partial(self._send, machine, call, key, otel_context.get_current())
        if not self.calls.submit(key, sent, group=machine.machine_id):
            log.warning(
                "%s of %s recorded as re-issued but not sent: the reaper is stopping",
                call.operation,
                machine.machine_id,
            )

    def _send(
        self, machine: MachineSnapshot, call: ReissueCall, key: str, parent: otel_context.Context
    ) -> None:
        """In the pool: the re-issued call, with no transaction open, then its outcome
        (counted in the next pass)."""
        decisions = DecisionLog(NAME, instruments=self.instruments)
        with _tracer.start_as_current_span(f"reaper.{NAME}.{call.operation}", context=parent):
            try:
                self._send_and_record(machine, call, key, decisions)
            finally:
                self.answers.add_report(decisions.report)

    def _send_and_record(
        self, machine: MachineSnapshot, call: ReissueCall, key: str, decisions: DecisionLog
    ) -> None:
        offering = machine.offering or machine_pb2.Offering()
        send = self.provider.stop if call.operation == "stop" else self.provider.destroy
        try:
            send(machine.machine_id, offering, machine.provider_instance_id or "", key)
        except NotYetDone as err:
            if call.operation != "destroy":
                self._call_failed(machine, call, key, err)
                decisions.acted(machine.machine_id, f"{call.operation}_reissue_failed", str(err))
                return
            record_unconfirmed(self.sessions, self.lease, self.clock.now(), NAME, machine, err)
            decisions.acted(machine.machine_id, "destroy_unconfirmed", str(err))
            return
        except Exception as err:
            if not isinstance(err, GpufleetError):
                log.exception("unexpected error re-issuing %s of %s", call.operation, machine.machine_id)
            self._call_failed(machine, call, key, err)
            decisions.acted(machine.machine_id, f"{call.operation}_reissue_failed", str(err))
            return
        done = self._finish(
            machine, FinishTransition(call.end), why=f"{NAME}: the re-issued {call.operation} succeeded"
        )
        decisions.acted(
            machine.machine_id,
            f"{call.operation}_reissued",
            call.details if done else "done, but the row moved meanwhile; not overwritten",
        )

    def _call_failed(self, machine: MachineSnapshot, call: ReissueCall, key: str, err: Exception) -> None:
        kind = getattr(err, "kind", type(err).__name__)
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            record_failure(
                session,
                self.clock.now(),
                FailureClass.PROVIDER_CALL_FAILED.value,
                NAME,
                machine_id=machine.machine_id,
                details=f"re-issued {call.operation} failed ({kind}): {err}; it stays {machine.state}",
                # The first call's incident: one per transition, however often it fails.
                incident_key=f"{FailureClass.PROVIDER_CALL_FAILED.value}:{key}",
            )

    def _finish(self, machine: MachineSnapshot, finish: FinishTransition, *, why: str) -> bool:
        now = self.clock.now()
        values = finish_values(finish, machine, now)
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            return lifecycle.transition(
                session,
                machine.machine_id,
                MachineState(machine.state),
                finish.end,
                by=lifecycle.Actor.REAPER,
                why=why,
                now=now,
                where=finish_where(machine),
                **values,
            )

    def _alert(self, machine: MachineSnapshot, alert: AlertStuck) -> bool:
        """One ledger row (and incident) per stuck transition; False when already alerted."""
        assert machine.state_changed_at is not None
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            stuck_rows = session.scalars(
                select(Failure.at).where(
                    Failure.machine_id == machine.machine_id,
                    Failure.failure_class == FailureClass.TRANSITION_STUCK.value,
                )
            ).all()
            if not opens_incident(machine, stuck_rows):
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
