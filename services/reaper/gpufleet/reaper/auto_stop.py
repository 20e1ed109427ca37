"""Auto-stop: the reversible half of the money chain (DESIGN §4, every 30 s).

A machine whose ``stop_due_at`` has passed is stopped — its disk kept — once the ladder
is cleared (no exempt-class gate: this net does not read reports), unless it is one of its
pool's warm machines (``warm_held``, until the pool idle release lets them go). Stop always falls due
before destroy, so a machine the idle scanner misjudged can still be started again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool
from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import RUNNING_STATES, MachineIntent, MachineState
from gpufleet.common.db.models import Machine
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.detection_latency import idle_since
from gpufleet.reaper.refusal import MachineSnapshot, NetGates, RefusalReason, Refuse, first_refusal
from gpufleet.reaper.snapshot import scan
from gpufleet.reaper.transition import MachineProvider, Transition, TransitionRunner

NAME = "auto_stop"

STOP = Transition(
    operation="stop",
    detector=NAME,
    intent=MachineIntent.STOPPED,
    transitional=MachineState.STOPPING,
    end=MachineState.STOPPED,
)


@dataclass(frozen=True)
class AutoStopPolicy:
    # Counted from first_observed_at: a machine still pulling its image is not stopped.
    grace: timedelta = timedelta(minutes=10)
    # The idle scanner's stop_after: stop_due_at was armed this far after the first quiet
    # sample. It decides nothing here; it dates "idle since" for the detection latency.
    stop_after: timedelta = timedelta(minutes=5)

    @property
    def gates(self) -> NetGates:
        return NetGates(net=NAME, grace=self.grace, reads_reports=False)


@dataclass(frozen=True)
class StopMachine:
    machine_id: str


def decide(now: datetime, machine: MachineSnapshot, policy: AutoStopPolicy) -> StopMachine | Refuse | None:
    """Stop, refuse (naming the gate), or nothing to do (the stop timer is not due)."""
    if machine.stop_due_at is None or machine.stop_due_at > now:
        return None
    reason = first_refusal(now, machine, policy.gates)
    if reason is not None:
        return Refuse(reason)
    if machine.state not in RUNNING_STATES:
        # STOPPED already, or a transitional/unknown state: nothing here to stop safely.
        return Refuse(RefusalReason.NOT_RUNNING)
    if machine.warm_held:
        return Refuse(RefusalReason.WARM_CAPACITY)
    return StopMachine(machine.machine_id)


class AutoStop:
    name = NAME

    def __init__(
        self,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        clock: Clock,
        provider: MachineProvider,
        policy: AutoStopPolicy,
        *,
        calls: CallPool | None = None,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.provider = provider
        self.policy = policy
        self.instruments = instruments
        self.runner = TransitionRunner(sessions, lease, clock, calls=calls, instruments=instruments)

    def scan(self, now: datetime) -> list[MachineSnapshot]:
        # ix_machines_stop_due: only armed, live machines are read.
        with self.sessions() as session:
            return scan(session, [Machine.stop_due_at.is_not(None), Machine.stop_due_at <= now])

    def run(self, now: datetime) -> TickReport:
        decisions = DecisionLog(NAME, self.runner.answered(), self.instruments)
        for machine in self.scan(now):
            decision = decide(now, machine, self.policy)
            if isinstance(decision, Refuse):
                decisions.refused(machine.machine_id, decision.reason)
            elif isinstance(decision, StopMachine):
                self.runner.execute(
                    STOP,
                    machine,
                    now,
                    decisions,
                    guards=[
                        Machine.stop_due_at.is_not(None),
                        Machine.stop_due_at <= now,
                        Machine.state.in_(sorted(s.value for s in RUNNING_STATES)),
                        # Pinned warm since the scan: the pin wins.
                        Machine.warm_held.is_(False),
                    ],
                    clear_at_begin=[Machine.stop_due_at],
                    call=self.provider.stop,
                    why=f"idle, stop due at {machine.stop_due_at:%Y-%m-%d %H:%M:%S}",
                    first_sign=idle_since(machine.stop_due_at, self.policy.stop_after),
                )
        return decisions.report
