"""The one run loop of a net whose decision is act, refuse, or nothing to do.

Auto-stop, auto-destroy, provision deadline and went silent each read the rows their due
predicate selects, decide each one with a pure ``decide`` over the snapshot, count a
refusal by its gate, and hand an act to the :class:`~gpufleet.reaper.transition.TransitionRunner`
(fenced claim, intent before the call, the call in the provider pool, the outcome
recorded). Only what differs between them is a net's: its :class:`OneStepSpec` — the due
predicate in its two forms, ``decide``, and how an act is claimed — exported by its module
beside the rules it states. The loop itself is written once, here; the simulator runs the
same specs' ``decide`` (``gpufleet.sim.world``). The constructor and the pass are
:class:`ClaimingNet`'s, which the ``gpu_fault`` net shares too (its scan reads more than a
snapshot, and it writes its refusals to the ledger: see its class).

The due predicate is written twice, side by side in each net's module, and proven equal
rather than derived: its SQL form is shaped for the index that keeps the scan cheap (a
partial index's predicate, an indexed ``CASE``), which a generator would have to
reproduce exactly, and its Python form is what ``decide`` checks first, so a row that
stopped being due between the scan and the decision is left alone. A test runs both over
one table of rows on PostgreSQL (tests/integration/reaper/test_due_predicates.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool
from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import MachineState
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, OutcomePolicy
from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.refusal import MachineSnapshot, Refuse
from gpufleet.reaper.snapshot import scan
from gpufleet.reaper.transition import (
    Detection,
    MachineProvider,
    TimerColumn,
    Transition,
    TransitionRunner,
)
from gpufleet.v1 import machine_pb2

P = TypeVar("P")
A = TypeVar("A")
# What a net's scan reads per machine (a snapshot, or more).
R = TypeVar("R")

ProviderCall = Callable[[str, machine_pb2.Offering, str, str], object]


@dataclass(frozen=True)
class Claim:
    """How one decided act is claimed: the compare-and-set guards on what the scan saw, the
    timers cleared, the ledger row's details, and what is recorded on the machine."""

    guards: Sequence[ColumnElement[bool]]
    clear_at_begin: Sequence[TimerColumn] = ()
    clear_at_end: Sequence[TimerColumn] = ()
    # The detection's ledger details (the net's ``detects`` class), when it has one.
    details: str = ""
    why: str = ""
    first_sign: datetime | None = None


@dataclass(frozen=True)
class OneStepSpec(Generic[P, A]):
    """What makes a one-step net itself; the loop is :class:`OneStepNet`'s."""

    name: str
    # What an act does (stop or destroy, for this net) and the ledger class it appends in
    # the claiming transaction (None: no detection, e.g. the money chain): the simulator
    # acts from the same two.
    transition: Transition
    detects: FailureClass | None
    # The due predicate's SQL form: the scan's WHERE (also part of most claims' guards).
    due: Callable[[datetime, P], list[ColumnElement[bool]]]
    # When the machine falls due if nothing about it changes (None: it will not; its
    # requeue-after): the predicate over a snapshot (``is_due``), and the simulator wakes
    # the net then.
    due_at: Callable[[MachineSnapshot, P], datetime | None]
    decide: Callable[[datetime, MachineSnapshot, P], A | Refuse | None]
    # The decision that acts (the rest refuse or do nothing).
    acts: type[A]
    claim: Callable[[datetime, MachineSnapshot, A, P], Claim]

    def is_due(self, now: datetime, machine: MachineSnapshot, policy: P) -> bool:
        """:attr:`due` over a snapshot: ``decide``'s first check."""
        return due_by(self.due_at(machine, policy), now)


def due_by(due_at: datetime | None, now: datetime) -> bool:
    """Whether a machine that falls due at ``due_at`` is due ``now``: the one way each net's
    ``is_due`` reads its ``due_at``."""
    return due_at is not None and due_at <= now


def provider_call(provider: MachineProvider, transition: Transition) -> ProviderCall:
    """The provider call that makes ``transition``."""
    return provider.stop if transition.end is MachineState.STOPPED else provider.destroy


class ClaimingNet(ABC, Generic[P, R]):
    """What every net that claims through one :class:`TransitionRunner` shares: its
    dependencies, and a pass — scan, then act on what the scan read, reported with what the
    runner's calls answered since the last pass. A net says how it scans and how it acts.

    :class:`OneStepNet` is the one for nets whose scan is the snapshot alone; the
    ``gpu_fault`` net is the other: its rows carry the findings, the slots still held and
    when the fault was first acted on, and its refusals are written to the ledger.
    """

    name: str

    def __init__(
        self,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        clock: Clock,
        provider: MachineProvider,
        policy: P,
        outcomes: OutcomePolicy | None = None,
        *,
        calls: CallPool | None = None,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.lease = lease
        self.provider = provider
        self.policy = policy
        self.instruments = instruments
        self.runner = TransitionRunner(sessions, lease, clock, outcomes, calls=calls, instruments=instruments)

    @abstractmethod
    def scan(self, now: datetime) -> Sequence[R]: ...

    @abstractmethod
    def act(self, now: datetime, rows: Sequence[R], decisions: DecisionLog) -> None:
        """Decide and apply for what one scan read (each claim re-checks the row)."""

    def run(self, now: datetime) -> TickReport:
        decisions = DecisionLog(self.name, self.runner.answered(), self.instruments)
        self.act(now, self.scan(now), decisions)
        return decisions.report


class OneStepNet(ClaimingNet[P, MachineSnapshot], Generic[P, A]):
    """scan → decide → act through the refusal ladder, for one :class:`OneStepSpec`.

    A subclass names its spec (``spec = SPEC``) and nothing else.
    """

    spec: OneStepSpec[P, A]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The net is named by its spec, so the one-line subclass says nothing else.
        if "spec" in vars(cls):
            cls.name = cls.spec.name

    def due(self, now: datetime) -> list[ColumnElement[bool]]:
        return self.spec.due(now, self.policy)

    def scan(self, now: datetime) -> list[MachineSnapshot]:
        with self.sessions() as session:
            return scan(session, self.due(now))

    def act(self, now: datetime, machines: Sequence[MachineSnapshot], decisions: DecisionLog) -> None:
        spec = self.spec
        for machine in machines:
            decision = spec.decide(now, machine, self.policy)
            if isinstance(decision, Refuse):
                decisions.refused(machine.machine_id, decision.reason)
            elif isinstance(decision, spec.acts):
                claim = spec.claim(now, machine, decision, self.policy)
                self.runner.execute(
                    spec.transition,
                    machine,
                    now,
                    decisions,
                    guards=claim.guards,
                    clear_at_begin=claim.clear_at_begin,
                    clear_at_end=claim.clear_at_end,
                    call=provider_call(self.provider, spec.transition),
                    detection=Detection(spec.detects, claim.details) if spec.detects else None,
                    why=claim.why,
                    first_sign=claim.first_sign,
                )
