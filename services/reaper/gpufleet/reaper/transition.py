"""The acting rung of the ladder, shared by every net that calls the provisioner.

Record the intent and the transitional state in one fenced transaction, commit — in the
net's pass — then hand the provider call to the reaper's bounded pool
(:class:`~gpufleet.common.calls.CallPool`), which makes it with no transaction open
and records the outcome in a new transaction: success moves the machine to the end state;
failure leaves it transitional — visible, for the stuck-transition watchdog, never
silently back in the pool or silently retried — and appends a ``provider_call_failed``
row to the ledger. A destroy is done only when the provider confirms the instance gone (the
drivers read it again after the call): one the provider accepted but still shows (EC2's
shutting-down, a GCE delete still running) answers ``NotYetDone``, which appends a
``destroy_unconfirmed`` row instead — nothing alerts yet, the machine stays DESTROYING, and
the stuck-transition net reads it again on its next pass. The pass never waits on the
provider: a stop that takes minutes holds one worker of the pool, not the nets; what the
call did is counted into the net's next pass (:meth:`TransitionRunner.answered`).

The claiming write is a compare-and-set on what the scan saw (same state, still ours,
still not pinned, still due), so a decision made on a row that moved since the scan is
dropped rather than forced. A net that acts on a detection (boot failed, went silent, ...)
appends its ledger row in that same claiming transaction, and the row's routed outcome
takes effect there too (``record_failure(..., apply=True)``): the detection, the intent
and the transitional state are committed together, before the provider call.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from opentelemetry import context as otel_context
from sqlalchemy import ColumnElement
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from gpufleet.common import lifecycle, spot_history
from gpufleet.common.calls import CallPool, Outcomes
from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import MachineIntent, MachineState
from gpufleet.common.db.models import Machine
from gpufleet.common.errors import GpufleetError
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, OutcomePolicy, record_failure
from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.provider_errors import NotYetDone
from gpufleet.common.telemetry import tracer
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.detection_latency import DetectionLatency
from gpufleet.reaper.refusal import MachineSnapshot, RefusalReason
from gpufleet.reaper.snapshot import no_live_attempt, not_destroyed, ours
from gpufleet.v1 import machine_pb2

log = logging.getLogger(__name__)
_tracer = tracer("gpufleet.reaper")

TimerColumn = InstrumentedAttribute[datetime | None]


class MachineProvider(Protocol):
    """The provisioner calls a reaper makes (``ProvisionerClient`` satisfies it).

    Both are idempotent by ``request_id``; destroying an instance that is already gone
    succeeds (returns False).
    """

    def stop(
        self, machine_id: str, offering: machine_pb2.Offering, provider_instance_id: str, request_id: str
    ) -> Any: ...

    def destroy(
        self, machine_id: str, offering: machine_pb2.Offering, provider_instance_id: str, request_id: str
    ) -> bool: ...


@dataclass(frozen=True)
class Transition:
    """One provider-backed move of a machine: ``intent`` + ``transitional`` → ``end``."""

    operation: str
    detector: str
    intent: MachineIntent
    transitional: MachineState
    end: MachineState


def destroy_transition(detector: str) -> Transition:
    """Destroy, on behalf of ``detector`` (the net that decided it)."""
    return Transition(
        operation="destroy",
        detector=detector,
        intent=MachineIntent.DESTROYED,
        transitional=MachineState.DESTROYING,
        end=MachineState.DESTROYED,
    )


@dataclass(frozen=True)
class Detection:
    """The ledger row a net appends when it claims a machine for what it detected."""

    failure_class: FailureClass
    details: str


def record_unconfirmed(
    sessions: sessionmaker[Session],
    lease: LeaderLease,
    now: datetime,
    detector: str,
    machine: MachineSnapshot,
    err: NotYetDone,
) -> None:
    """The destroy call was accepted and the provider does not show the instance gone yet:
    a ``destroy_unconfirmed`` row (routed NOTHING); the machine stays DESTROYING, and the
    stuck-transition net reads it on its next pass (it looks for this row)."""
    with sessions() as session, session.begin():
        lease.fence(session)
        record_failure(
            session,
            now,
            FailureClass.DESTROY_UNCONFIRMED.value,
            detector,
            machine_id=machine.machine_id,
            details=f"{err}; it stays {MachineState.DESTROYING.value} and is read again on the next pass",
        )


def spot_run_seconds(machine: MachineSnapshot, now: datetime) -> float:
    """The spot seconds this claim adds to the machine's history (gpufleet.common.spot_history)."""
    offering = machine.offering
    spot = offering is not None and offering.capacity_type == machine_pb2.CAPACITY_TYPE_SPOT
    return spot_history.claimed_s(spot, machine.state, machine.first_observed_at, now)


def request_id(operation: str, machine_id: str, at: datetime) -> str:
    """The idempotency key: the machine, the operation, and when the transition began.

    The start time keeps a later stop of the same machine (after a restart) from being
    mistaken by the provider for a replay of this one; a retry of this very transition
    reads the same ``state_changed_at`` and so sends the same key.
    """
    return f"{operation}:{machine_id}:{at.isoformat()}"


class TransitionRunner:
    """Claims one transition for one machine in the net's pass; the call and its outcome
    run in the reaper's provider-call pool."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        clock: Clock,
        outcomes: OutcomePolicy | None = None,
        calls: CallPool | None = None,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.lease = lease
        self.clock = clock
        self.outcomes = outcomes or OutcomePolicy()
        self.instruments = instruments
        # A net built alone (a test, a benchmark) gets a pool of its own; the reaper hands
        # every net the one pool, so that ``provider_call_workers`` bounds them all.
        self.calls = calls or CallPool(16, "provider-calls")
        self.answers = Outcomes()

    def answered(self) -> TickReport:
        """What this runner's calls did since the last pass: the next pass's report
        starts from it."""
        return self.answers.take()

    def execute(
        self,
        transition: Transition,
        machine: MachineSnapshot,
        now: datetime,
        decisions: DecisionLog,
        *,
        guards: Sequence[ColumnElement[bool]],
        clear_at_begin: Sequence[TimerColumn] = (),
        clear_at_end: Sequence[TimerColumn] = (),
        call: Callable[[str, machine_pb2.Offering, str, str], object],
        detection: Detection | None = None,
        why: str = "",
        first_sign: datetime | None = None,
    ) -> bool:
        """Claim ``transition`` and hand its call to the pool; returns whether it was claimed.

        ``call(machine_id, offering, provider_instance_id, request_id)`` is the provider call;
        ``detection``, when given, is appended to the ledger in the claiming transaction.
        ``why`` (else the detection's details) is recorded on the machine as the reason.
        ``first_sign`` is when the failure the net acts on began (its
        :mod:`~gpufleet.reaper.detection_latency` row): the claim, once committed, is
        measured from it. The call's outcome (``<operation>`` or ``<operation>_failed``) is
        logged when it answers and counted in the net's next pass.
        """
        if not self.calls.accepting:
            log.info("the reaper is stopping: %s of %s not claimed", transition.operation, machine.machine_id)
            return False
        reason = f"{transition.detector}: {why or (detection.details if detection else transition.operation)}"
        if not self._claim(transition, machine, now, guards, clear_at_begin, detection, reason):
            decisions.refused(machine.machine_id, RefusalReason.CHANGED_SINCE_SCAN)
            return False
        # Committed: the net has acted, whatever the provider call then answers.
        DetectionLatency(decisions.net, self.instruments).acted(first_sign, now)
        key = request_id(transition.operation, machine.machine_id, now)
        sent = functools.partial(
            self._call,
            transition,
            machine,
            key,
            call,
            clear_at_end,
            reason,
            decisions.net,
            otel_context.get_current(),
        )
        if not self.calls.submit(key, sent, group=machine.machine_id):
            # Only when the pool closed since the check above (the reaper is stopping).
            log.warning(
                "%s of %s claimed but not sent: the reaper is stopping; it stays %s for the "
                "stuck-transition watchdog",
                transition.operation,
                machine.machine_id,
                transition.transitional.value,
            )
        return True

    def _call(
        self,
        transition: Transition,
        machine: MachineSnapshot,
        key: str,
        call: Callable[[str, machine_pb2.Offering, str, str], object],
        clear_at_end: Sequence[TimerColumn],
        reason: str,
        net: str,
        parent: otel_context.Context,
    ) -> None:
        """In the pool: the provider call, with no transaction open, then its outcome."""
        decisions = DecisionLog(net, instruments=self.instruments)
        with _tracer.start_as_current_span(f"reaper.{net}.{transition.operation}", context=parent):
            try:
                self._call_and_record(transition, machine, key, call, clear_at_end, reason, decisions)
            finally:
                self.answers.add_report(decisions.report)

    def _call_and_record(
        self,
        transition: Transition,
        machine: MachineSnapshot,
        key: str,
        call: Callable[[str, machine_pb2.Offering, str, str], object],
        clear_at_end: Sequence[TimerColumn],
        reason: str,
        decisions: DecisionLog,
    ) -> None:
        offering = machine.offering or machine_pb2.Offering()
        try:
            call(machine.machine_id, offering, machine.provider_instance_id or "", key)
        except NotYetDone as err:
            if transition.end is not MachineState.DESTROYED:
                self._record_failure(transition, machine, key, err)
                decisions.acted(machine.machine_id, f"{transition.operation}_failed", str(err))
                return
            record_unconfirmed(self.sessions, self.lease, self.clock.now(), transition.detector, machine, err)
            decisions.acted(machine.machine_id, "destroy_unconfirmed", str(err))
            return
        except Exception as err:
            if not isinstance(err, GpufleetError):
                log.exception("unexpected error from %s of %s", transition.operation, machine.machine_id)
            self._record_failure(transition, machine, key, err)
            decisions.acted(machine.machine_id, f"{transition.operation}_failed", str(err))
            return
        self._finish(transition, machine, clear_at_end, reason)
        decisions.acted(machine.machine_id, transition.operation)

    def _claim(
        self,
        transition: Transition,
        machine: MachineSnapshot,
        now: datetime,
        guards: Sequence[ColumnElement[bool]],
        clear: Sequence[TimerColumn],
        detection: Detection | None,
        reason: str,
    ) -> bool:
        values: dict[str, object] = {c.key: None for c in clear}
        ran_s = spot_run_seconds(machine, now)
        if ran_s:
            # A spot machine's running time feeds its measured pre-emption rate (expected cost).
            values["spot_seconds"] = Machine.spot_seconds + ran_s
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            claimed = lifecycle.transition(
                session,
                machine.machine_id,
                MachineState(machine.state),
                transition.transitional,
                by=lifecycle.Actor.REAPER,
                why=reason,
                now=now,
                where=[not_destroyed(), *ours(), no_live_attempt(), *guards],
                intent=transition.intent.value,
                **values,
            )
            if not claimed:
                return False
            if detection is not None:
                record_failure(
                    session,
                    now,
                    detection.failure_class.value,
                    transition.detector,
                    machine_id=machine.machine_id,
                    details=detection.details,
                    apply=True,
                    policy=self.outcomes,
                )
            return True

    def _finish(
        self, transition: Transition, machine: MachineSnapshot, clear: Sequence[TimerColumn], reason: str
    ) -> None:
        values: dict[str, Any] = {c.key: None for c in clear}
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            finished = lifecycle.transition(
                session,
                machine.machine_id,
                transition.transitional,
                transition.end,
                by=lifecycle.Actor.REAPER,
                why=f"{transition.operation} done; {reason}",
                now=self.clock.now(),
                **values,
            )
            if not finished:
                log.warning(
                    "%s of %s succeeded but the machine left %s meanwhile; not overwritten",
                    transition.operation,
                    machine.machine_id,
                    transition.transitional.value,
                )

    def _record_failure(
        self, transition: Transition, machine: MachineSnapshot, key: str, err: Exception
    ) -> None:
        kind = getattr(err, "kind", type(err).__name__)
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            record_failure(
                session,
                self.clock.now(),
                FailureClass.PROVIDER_CALL_FAILED.value,
                transition.detector,
                machine_id=machine.machine_id,
                details=(
                    f"{transition.operation} failed ({kind}): {err}; the machine stays "
                    f"{transition.transitional.value} for the stuck-transition watchdog"
                ),
                incident_key=f"{FailureClass.PROVIDER_CALL_FAILED.value}:{key}",
            )
