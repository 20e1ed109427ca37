"""Lost detector: a machine we cannot reach, but which is still there, is marked lost and
taken out of rotation — and never destroyed (DESIGN §4, every 60 s).

It reads all three liveness channels together, because its question is the operator's:
is the machine still there, and can we reach it? The probe has been failing for the
threshold while another channel says the machine exists — the provider still lists the
instance, or the worker still reports for itself — so the fault may be in the path
rather than in the machine. The scheduler routes nothing to a lost machine. When the
probe succeeds again the mark is lifted.

This net holds no provisioner: it cannot stop or destroy anything, at any cadence.
Whether a lost machine is ever destroyed is the went-silent net's decision alone, on the
worker's own clock. Only machines this platform answers for (``managed``) are marked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import ClassVar

from sqlalchemy import ColumnElement, or_, true, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import RUNNING_STATES
from gpufleet.common.db.models import Machine
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.detection_latency import DetectionLatency, probe_failing_since
from gpufleet.reaper.refusal import MachineSnapshot, RefusalReason, Refuse
from gpufleet.reaper.snapshot import not_destroyed, scan

NAME = "lost_detector"


@dataclass(frozen=True)
class LostPolicy:
    # How long the probe must have been failing.
    lost_after: timedelta = timedelta(minutes=3)
    # How recent the provider's listing or the worker's report must be to count as
    # "still there" (the reconcile lists every minute; workers report every few seconds).
    still_there_within: timedelta = timedelta(minutes=5)


@dataclass(frozen=True)
class MarkLost:
    """Take the machine out of rotation. ``values`` is the row's update and ``detects`` the
    ledger's class for it: the net's SQL and the simulator apply the same (issue 26)."""

    machine_id: str
    details: str
    values: ClassVar[Mapping[str, object]] = MappingProxyType({"lost": True})
    detects: ClassVar[FailureClass] = FailureClass.MACHINE_LOST


@dataclass(frozen=True)
class UnmarkLost:
    """Reachable again: the mark is lifted (no ledger row)."""

    machine_id: str
    values: ClassVar[Mapping[str, object]] = MappingProxyType({"lost": False})


def _fresh(at: datetime | None, now: datetime, within: timedelta) -> bool:
    return at is not None and now - at <= within


def decide(
    now: datetime, machine: MachineSnapshot, policy: LostPolicy
) -> MarkLost | UnmarkLost | Refuse | None:
    """Mark, unmark, refuse (naming why), or nothing to do."""
    if not machine.managed:
        return None
    failing = machine.probe_failed_since
    if machine.lost:
        # Reachable again: the last contact succeeded.
        if failing is None and machine.probe_ok_at is not None:
            return UnmarkLost(machine.machine_id)
        return None
    if machine.state not in RUNNING_STATES or failing is None or now - failing < policy.lost_after:
        return None
    if machine.probe_ok_at is None:
        # Never reached at all: nothing was lost; the provision deadline and boot nets own it.
        return None
    provider = _fresh(machine.provider_seen_at, now, policy.still_there_within)
    worker = _fresh(machine.worker_report_at, now, policy.still_there_within)
    if not (provider or worker):
        return Refuse(RefusalReason.NO_SIGN_OF_LIFE)
    seen_by = " and ".join(
        n for n, fresh in (("the provider lists it", provider), ("its worker reports", worker)) if fresh
    )
    return MarkLost(
        machine.machine_id,
        f"probe failing since {failing.isoformat()} ({int((now - failing).total_seconds())}s) "
        f"while {seen_by}: the path to it is down; no work is routed to it",
    )


def due_at(machine: MachineSnapshot, policy: LostPolicy) -> datetime | None:
    """When the detector first decides to mark ``machine`` if nothing else changes (its
    requeue-after): its probe failing for ``lost_after``. None where no time alone leads to
    a mark — already lost (the mark is lifted by a probe that succeeds, an event), not ours,
    not running, never reached, or its probe not failing. (At that time it may still refuse
    for want of a sign of life: the mark needs one, and only a listing or a report, events
    too, brings one.)"""
    failing = machine.probe_failed_since
    if (
        not machine.managed
        or machine.lost
        or machine.state not in RUNNING_STATES
        or failing is None
        or machine.probe_ok_at is None
    ):
        return None
    return failing + policy.lost_after


class LostDetector:
    name = NAME

    def __init__(
        self,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        clock: Clock,
        policy: LostPolicy,
        *,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.lease = lease
        self.clock = clock
        self.policy = policy
        self.instruments = instruments
        self.latency = DetectionLatency(NAME, instruments)

    def domain(self, now: datetime) -> list[ColumnElement[bool]]:
        # ix_machines_lost and ix_machines_probe_failing: only marked machines and machines
        # whose probe has been failing long enough are read.
        return [
            Machine.managed.is_(True),
            # "lost = true", not "lost IS true": the form the planner matches to the index.
            or_(Machine.lost == true(), Machine.probe_failed_since <= now - self.policy.lost_after),
        ]

    def scan(self, now: datetime) -> list[MachineSnapshot]:
        with self.sessions() as session:
            return scan(session, self.domain(now), with_offering=False)

    def run(self, now: datetime) -> TickReport:
        decisions = DecisionLog(NAME, instruments=self.instruments)
        for machine in self.scan(now):
            decision = decide(now, machine, self.policy)
            if isinstance(decision, Refuse):
                decisions.refused(machine.machine_id, decision.reason)
            elif isinstance(decision, MarkLost):
                if self._mark(machine, now, decision):
                    decisions.acted(machine.machine_id, "mark_lost", decision.details)
                    self.latency.acted(probe_failing_since(machine), now)
                else:
                    decisions.refused(machine.machine_id, RefusalReason.CHANGED_SINCE_SCAN)
            elif isinstance(decision, UnmarkLost) and self._unmark(machine):
                decisions.acted(machine.machine_id, "unmark_lost", "reachable again")
        return decisions.report

    def _mark(self, machine: MachineSnapshot, now: datetime, mark: MarkLost) -> bool:
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            result = session.execute(
                update(Machine)
                .where(
                    Machine.id == machine.machine_id,
                    Machine.managed.is_(True),
                    not_destroyed(),
                    Machine.lost.is_(False),
                    # Still failing since the same moment: no success came in between.
                    Machine.probe_failed_since == machine.probe_failed_since,
                )
                .values(**mark.values)
                .execution_options(synchronize_session=False)
            )
            if getattr(result, "rowcount", 0) != 1:
                return False
            record_failure(
                session,
                now,
                mark.detects.value,
                NAME,
                machine_id=machine.machine_id,
                details=mark.details,
            )
            return True

    def _unmark(self, machine: MachineSnapshot) -> bool:
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            result = session.execute(
                update(Machine)
                .where(
                    Machine.id == machine.machine_id,
                    Machine.managed.is_(True),
                    Machine.lost.is_(True),
                    Machine.probe_failed_since.is_(None),
                )
                .values(**UnmarkLost.values)
                .execution_options(synchronize_session=False)
            )
            return bool(getattr(result, "rowcount", 0) == 1)
