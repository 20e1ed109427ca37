"""Auto-destroy: the irreversible end of the money chain (DESIGN §4, every 30 s).

A machine whose ``destroy_due_at`` has passed is destroyed once the ladder is cleared and
the machine is stopped or idle: STOPPED, or running with no stop pending. A running
machine whose stop is still pending is left for auto-stop first — the reversible action
always precedes the irreversible one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool
from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import RUNNING_STATES, MachineState
from gpufleet.common.db.models import Machine
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.detection_latency import idle_since
from gpufleet.reaper.refusal import MachineSnapshot, NetGates, RefusalReason, Refuse, first_refusal
from gpufleet.reaper.snapshot import scan
from gpufleet.reaper.transition import MachineProvider, TransitionRunner, destroy_transition

NAME = "auto_destroy"

DESTROY = destroy_transition(NAME)

_RUNNING = sorted(s.value for s in RUNNING_STATES)


@dataclass(frozen=True)
class AutoDestroyPolicy:
    grace: timedelta = timedelta(minutes=10)
    # The idle scanner's destroy_after: destroy_due_at was armed this far after the first
    # quiet sample. It decides nothing here; it dates "idle since" for the detection latency.
    destroy_after: timedelta = timedelta(hours=2)

    @property
    def gates(self) -> NetGates:
        return NetGates(net=NAME, grace=self.grace, reads_reports=False)


@dataclass(frozen=True)
class DestroyMachine:
    machine_id: str


def decide(
    now: datetime, machine: MachineSnapshot, policy: AutoDestroyPolicy
) -> DestroyMachine | Refuse | None:
    """Destroy, refuse (naming the gate), or nothing to do (the destroy timer is not due)."""
    if machine.destroy_due_at is None or machine.destroy_due_at > now:
        return None
    reason = first_refusal(now, machine, policy.gates)
    if reason is not None:
        return Refuse(reason)
    if machine.state == MachineState.STOPPED:
        return DestroyMachine(machine.machine_id)
    if machine.state in RUNNING_STATES:
        if machine.stop_due_at is not None:
            return Refuse(RefusalReason.STOP_PENDING)
        if machine.warm_held:
            return Refuse(RefusalReason.WARM_CAPACITY)
        return DestroyMachine(machine.machine_id)
    # Transitional (a failed call is the stuck-transition watchdog's) or unknown.
    return Refuse(RefusalReason.NOT_STOPPED_OR_IDLE)


class AutoDestroy:
    name = NAME

    def __init__(
        self,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        clock: Clock,
        provider: MachineProvider,
        policy: AutoDestroyPolicy,
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
        # ix_machines_destroy_due: only armed, live machines are read.
        with self.sessions() as session:
            return scan(session, [Machine.destroy_due_at.is_not(None), Machine.destroy_due_at <= now])

    def run(self, now: datetime) -> TickReport:
        decisions = DecisionLog(NAME, self.runner.answered(), self.instruments)
        for machine in self.scan(now):
            decision = decide(now, machine, self.policy)
            if isinstance(decision, Refuse):
                decisions.refused(machine.machine_id, decision.reason)
            elif isinstance(decision, DestroyMachine):
                self.runner.execute(
                    DESTROY,
                    machine,
                    now,
                    decisions,
                    guards=[
                        Machine.destroy_due_at.is_not(None),
                        Machine.destroy_due_at <= now,
                        or_(
                            Machine.state == MachineState.STOPPED.value,
                            Machine.state.in_(_RUNNING)
                            & Machine.stop_due_at.is_(None)
                            & Machine.warm_held.is_(False),
                        ),
                    ],
                    clear_at_end=[Machine.stop_due_at, Machine.destroy_due_at],
                    call=self.provider.destroy,
                    why=f"idle ({machine.state}), destroy due at {machine.destroy_due_at:%Y-%m-%d %H:%M:%S}",
                    first_sign=idle_since(machine.destroy_due_at, self.policy.destroy_after),
                )
        return decisions.report
