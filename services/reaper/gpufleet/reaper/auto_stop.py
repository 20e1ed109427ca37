"""Auto-stop: the reversible half of the money chain (DESIGN §4, every 30 s).

A machine whose ``stop_due_at`` has passed is stopped — its disk kept — once the ladder
is cleared (no exempt-class gate: this net does not read reports), unless it is one of its
pool's warm machines (``warm_held``, until the pool idle release lets them go). Stop always falls due
before destroy, so a machine the idle scanner misjudged can still be started again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement

from gpufleet.common.db.enums import RUNNING_STATES, MachineIntent, MachineState
from gpufleet.common.db.models import Machine
from gpufleet.reaper.detection_latency import idle_since
from gpufleet.reaper.net_runner import Claim, OneStepNet, OneStepSpec, due_by
from gpufleet.reaper.refusal import MachineSnapshot, NetGates, RefusalReason, Refuse, first_refusal
from gpufleet.reaper.transition import Transition

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
    if not is_due(now, machine, policy):
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


# The guards' parts that never change, built once (SQL expressions are immutable): a claim
# is built for every act, in the reaper and in every simulated month.
_ARMED = Machine.stop_due_at.is_not(None)
_RUNNING = Machine.state.in_(sorted(s.value for s in RUNNING_STATES))
_NOT_PINNED = Machine.warm_held.is_(False)


def due(now: datetime, policy: AutoStopPolicy) -> list[ColumnElement[bool]]:
    """The scan's WHERE: the stop timer is armed and has passed (ix_machines_stop_due: only
    armed, live machines are read)."""
    return [_ARMED, Machine.stop_due_at <= now]


def due_at(machine: MachineSnapshot, policy: AutoStopPolicy) -> datetime | None:
    """When its stop falls due: its stop timer."""
    return machine.stop_due_at


def is_due(now: datetime, machine: MachineSnapshot, policy: AutoStopPolicy) -> bool:
    """:func:`due` over a snapshot."""
    return due_by(due_at(machine, policy), now)


def claim(now: datetime, machine: MachineSnapshot, act: StopMachine, policy: AutoStopPolicy) -> Claim:
    return Claim(
        # Pinned warm since the scan: the pin wins.
        guards=[*due(now, policy), _RUNNING, _NOT_PINNED],
        clear_at_begin=[Machine.stop_due_at],
        why=f"idle, stop due at {machine.stop_due_at:%Y-%m-%d %H:%M:%S}",
        first_sign=idle_since(machine.stop_due_at, policy.stop_after),
    )


SPEC = OneStepSpec(
    name=NAME,
    transition=STOP,
    detects=None,
    due=due,
    due_at=due_at,
    decide=decide,
    acts=StopMachine,
    claim=claim,
)


class AutoStop(OneStepNet[AutoStopPolicy, StopMachine]):
    spec = SPEC
