"""Auto-destroy: the irreversible end of the money chain (DESIGN §4, every 30 s).

A machine whose ``destroy_due_at`` has passed is destroyed once the ladder is cleared and
the machine is stopped or idle: STOPPED, or running with no stop pending. A running
machine whose stop is still pending is left for auto-stop first — the reversible action
always precedes the irreversible one.

A machine can also come to rest STOPPED with no destroy timer: its provider stopped it while
it was busy (a spot interruption with ``stop`` behaviour), someone stopped it outside the
platform, or it stopped itself — the idle scanner armed nothing, since it was never idle
while running, and never samples a stopped machine. Its disk bills until the scale step
starts it again, which may be never. Such a machine falls due once it has been stopped for
the money chain's own stop-to-destroy gap (``idle_destroy_after_s - idle_stop_after_s``):
it is then treated exactly as a machine the chain stopped for idleness would be at the
same point, by the same ladder — its grace counted from the stop when it was never observed
running (a start the provider refused clears ``first_observed_at``: a new life, not seen).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, or_

from gpufleet.common.db.enums import RUNNING_STATES, MachineState
from gpufleet.common.db.models import Machine
from gpufleet.reaper.detection_latency import idle_since
from gpufleet.reaper.net_runner import Claim, OneStepNet, OneStepSpec, due_by
from gpufleet.reaper.refusal import MachineSnapshot, NetGates, RefusalReason, Refuse, first_refusal
from gpufleet.reaper.transition import destroy_transition

NAME = "auto_destroy"

DESTROY = destroy_transition(NAME)

_RUNNING = sorted(s.value for s in RUNNING_STATES)


@dataclass(frozen=True)
class AutoDestroyPolicy:
    grace: timedelta = timedelta(minutes=10)
    # The idle scanner's destroy_after: destroy_due_at was armed this far after the first
    # quiet sample. It decides nothing here; it dates "idle since" for the detection latency.
    destroy_after: timedelta = timedelta(hours=2)
    # A STOPPED machine with no destroy timer is due this long after it stopped: the chain's
    # gap between its stop and its destroy (the idle scanner's destroy_after - stop_after).
    stopped_for: timedelta = timedelta(hours=2) - timedelta(minutes=5)

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
    if not is_due(now, machine, policy):
        return None
    gated = machine
    if machine.destroy_due_at is None and machine.first_observed_at is None:
        # Due as a machine stopped with no timer: its window runs from its stop, which the
        # row records. A start the provider refused leaves it STOPPED with first_observed_at
        # cleared (the start's intent begins a life never observed), and the grace gate
        # must not keep it for ever on that.
        gated = replace(machine, first_observed_at=machine.state_changed_at)
    reason = first_refusal(now, gated, policy.gates)
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


# The guards' parts that never change, built once (SQL expressions are immutable): a claim
# is built for every act, in the reaper and in every simulated month.
_ARMED = Machine.destroy_due_at.is_not(None)
# Stopped, or running with its stop done or cleared and not pinned warm since the scan.
_STOPPED_OR_IDLE = or_(
    Machine.state == MachineState.STOPPED.value,
    Machine.state.in_(_RUNNING) & Machine.stop_due_at.is_(None) & Machine.warm_held.is_(False),
)


_UNARMED_STOPPED = (Machine.state == MachineState.STOPPED.value) & Machine.destroy_due_at.is_(None)


def due(now: datetime, policy: AutoDestroyPolicy) -> list[ColumnElement[bool]]:
    """The scan's WHERE: the destroy timer is armed and has passed (ix_machines_destroy_due),
    or the machine has been STOPPED with none for the chain's gap (ix_machines_live_state)."""
    return [
        or_(
            _ARMED & (Machine.destroy_due_at <= now),
            _UNARMED_STOPPED & (Machine.state_changed_at <= now - policy.stopped_for),
        )
    ]


def due_at(machine: MachineSnapshot, policy: AutoDestroyPolicy) -> datetime | None:
    """When its destroy falls due: its destroy timer; with none, a STOPPED machine's stop
    plus the chain's gap (None: never, while the row stays as it is)."""
    if machine.destroy_due_at is not None:
        return machine.destroy_due_at
    if machine.state == MachineState.STOPPED and machine.state_changed_at is not None:
        return machine.state_changed_at + policy.stopped_for
    return None


def is_due(now: datetime, machine: MachineSnapshot, policy: AutoDestroyPolicy) -> bool:
    """:func:`due` over a snapshot."""
    return due_by(due_at(machine, policy), now)


def claim(now: datetime, machine: MachineSnapshot, act: DestroyMachine, policy: AutoDestroyPolicy) -> Claim:
    if machine.destroy_due_at is not None:
        why = f"idle ({machine.state}), destroy due at {machine.destroy_due_at:%Y-%m-%d %H:%M:%S}"
        first_sign = idle_since(machine.destroy_due_at, policy.destroy_after)
    else:
        # Stopped by its provider, outside the platform or by itself, with no timer armed.
        why = (
            f"stopped since {machine.state_changed_at:%Y-%m-%d %H:%M:%S} with no destroy timer "
            f"(not stopped by the money chain), for longer than the chain's stop-to-destroy gap "
            f"({policy.stopped_for.total_seconds():.0f}s)"
        )
        first_sign = machine.state_changed_at
    return Claim(
        guards=[*due(now, policy), _STOPPED_OR_IDLE],
        clear_at_end=[Machine.stop_due_at, Machine.destroy_due_at],
        why=why,
        first_sign=first_sign,
    )


SPEC = OneStepSpec(
    name=NAME,
    transition=DESTROY,
    detects=None,
    due=due,
    due_at=due_at,
    decide=decide,
    acts=DestroyMachine,
    claim=claim,
)


class AutoDestroy(OneStepNet[AutoDestroyPolicy, DestroyMachine]):
    spec = SPEC
