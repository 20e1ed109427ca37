"""The one refusal ladder every machine-level reaper walks before it acts (DESIGN §4).

Most of a reaper is the list of reasons not to fire: the provider call itself is one
line, and each refusal above it exists because the naive check destroys something it
should not. Every net that can stop or destroy (auto-stop, auto-destroy, provision
deadline, boot failure, went silent, GPU fault) walks the same ladder, in the same order, through
:func:`first_refusal` — a pure function over a :class:`MachineSnapshot`, so the order is
tested once, from a table, and no net can quietly skip a gate.

The nets that cannot stop or destroy (lost detector, stuck transition) do not walk the
ladder; they still refuse what is not ours (:func:`is_ours`), because a state nobody here
answers for is not a state they may write.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from gpufleet.common.db.enums import MachineOrigin, MachineState, WorkloadClass
from gpufleet.v1 import machine_pb2


class RefusalReason(StrEnum):
    """Why a net did not act on a machine; the value names the gate on spans and counters."""

    # The ladder, in the order it is walked.
    NOT_OURS = "NOT_OURS"
    ALREADY_DESTROYED = "ALREADY_DESTROYED"
    WORK_PINNED = "WORK_PINNED"
    EXEMPT_CLASS = "EXEMPT_CLASS"
    IN_GRACE_WINDOW = "IN_GRACE_WINDOW"
    # A net's own condition, checked only once the whole ladder has been cleared.
    NOT_RUNNING = "NOT_RUNNING"
    STOP_PENDING = "STOP_PENDING"
    NOT_STOPPED_OR_IDLE = "NOT_STOPPED_OR_IDLE"
    # The money chain: one of its pool's warm machines (its warm target, not yet released
    # by the pool idle release) is kept running while quiet.
    WARM_CAPACITY = "WARM_CAPACITY"
    # Boot failure: the live re-confirmation found start-up complete after all.
    STARTUP_HEALTHY = "STARTUP_HEALTHY"
    # Lost detector: the probe fails, but neither the provider's list nor the worker says
    # the machine is still there — not "lost" (a broken path) but gone, another net's case.
    NO_SIGN_OF_LIFE = "NO_SIGN_OF_LIFE"
    # GPU fault: attempts ended on the machine still hold their slots (their processes told
    # to stop, not yet gone), within the net's wait for them.
    SLOT_HELD = "SLOT_HELD"
    # Stuck transition: the provider could not be read this tick (no decision on no data).
    PROVIDER_UNREADABLE = "PROVIDER_UNREADABLE"
    # The row moved between the scan and the claiming write (another writer got there
    # first): the decision was made on stale data, so it is dropped, never forced.
    CHANGED_SINCE_SCAN = "CHANGED_SINCE_SCAN"


LADDER: tuple[RefusalReason, ...] = (
    RefusalReason.NOT_OURS,
    RefusalReason.ALREADY_DESTROYED,
    RefusalReason.WORK_PINNED,
    RefusalReason.EXEMPT_CLASS,
    RefusalReason.IN_GRACE_WINDOW,
)


@dataclass(frozen=True)
class MachineSnapshot:
    """What a reaper's scan read about one machine, in the same query.

    ``managed`` always travels with ``state``: a state nobody answers for is not a
    state a reaper may act on.
    """

    machine_id: str
    origin: str
    managed: bool
    state: str
    intent: str
    workload_class: str
    # Attempts in STARTING or RUNNING on this machine, counted in the scan query itself.
    live_attempts: int
    first_observed_at: datetime | None = None
    stop_due_at: datetime | None = None
    destroy_due_at: datetime | None = None
    agent_address: str | None = None
    provider_instance_id: str | None = None
    # The offering the machine was bought with: what a provider call must name.
    offering: machine_pb2.Offering | None = None
    lost: bool = False
    requested_at: datetime | None = None
    provision_deadline_at: datetime | None = None
    state_changed_at: datetime | None = None
    startup_failed_at: datetime | None = None
    # The three liveness channels (DESIGN §3). Which of them a net may read is that net's
    # design: went silent reads only worker_report_at.
    provider_seen_at: datetime | None = None
    probe_ok_at: datetime | None = None
    probe_failed_since: datetime | None = None
    worker_report_at: datetime | None = None
    # Held running for its pool's warm target (the scheduler's pin).
    warm_held: bool = False


@dataclass(frozen=True)
class NetGates:
    """How one net configures the ladder.

    ``grace`` is counted from ``first_observed_at`` (when this platform first saw the
    machine running, never the provider's launch time). ``reads_reports`` is true only for
    the nets whose question is "has the worker reported?": an exempt workload class never
    reports by design, so it is exempt from those nets by class, not by a longer timeout.
    """

    net: str
    grace: timedelta = timedelta(0)
    reads_reports: bool = False


@dataclass(frozen=True)
class Refuse:
    """A decision not to act, naming the gate that refused."""

    reason: RefusalReason


def is_ours(machine: MachineSnapshot) -> bool:
    """Our own provisioning record and our responsibility: the first rung of the ladder."""
    return machine.origin == MachineOrigin.PROVISIONED and machine.managed


def first_refusal(now: datetime, machine: MachineSnapshot, gates: NetGates) -> RefusalReason | None:
    """The first gate of the ladder that refuses, or None when the net may act."""
    if not is_ours(machine):
        # Only our own provisioning record makes a machine ours — never a provider list.
        return RefusalReason.NOT_OURS
    if machine.state == MachineState.DESTROYED:
        return RefusalReason.ALREADY_DESTROYED
    if machine.live_attempts > 0:
        # Silence during a long download or training step is normal; the job releases it.
        return RefusalReason.WORK_PINNED
    if gates.reads_reports and machine.workload_class != WorkloadClass.REPORTING:
        # Any class other than REPORTING (including one no code knows) never reports.
        return RefusalReason.EXEMPT_CLASS
    if gates.grace > timedelta(0) and (
        machine.first_observed_at is None or now < machine.first_observed_at + gates.grace
    ):
        # Never observed running: the window cannot be shown to have passed, so refuse.
        return RefusalReason.IN_GRACE_WINDOW
    return None
