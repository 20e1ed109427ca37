"""GPU fault: a machine whose worker reported a critical GPU finding is destroyed (every 60 s).

The scheduler acts on the finding the moment the heartbeat carries it
(``gpufleet.scheduler.gpu_faults``): the machine is cordoned and a ``gpu_fault`` ledger
row ends its attempts as our failure and requeues their jobs. That leaves the machine
itself, still billing with a broken GPU. Left to the money chain it would be stopped
after five quiet minutes and kept as warm STOPPED capacity for two hours — a stop keeps
the instance, and so the GPU that fell off the bus. This net **destroys** it instead,
through the one refusal ladder, so the next machine bought is a fresh one.

Its gate reads the stored findings (``gpu_findings``: a finding once stored stays, so a
critical one is never forgotten by a later report), never the live state of the GPU: the
agent's severity table has already decided what a finding means. It walks the ladder's
gates that fit a broken GPU — not ours (a self-registered box is cordoned, never
destroyed: a human repairs it), already destroyed, work pinned (a live attempt: it ends
through the ledger first) — but not the report gate (the question is not whether the
worker reports) nor a grace window (a fault known at once has nothing to wait for). Its
own gate, :attr:`RefusalReason.SLOT_HELD`: attempts the control plane ended still hold
their slots until the machine says their processes are gone, which the runner's stop
(checkpoint, logs) gets ``slot_release_wait`` to do; after that the destroy goes ahead, for
a process wedged on a fallen GPU never exits and the destroy is what stops it.

Each refusal is counted and logged like every net's, and written to the ledger once
(``gpu_fault_destroy_refused``, routed NOTHING) when it starts or changes reason, so an
operator reading the machine's rows learns why it still bills without a row a minute. The
claim appends ``gpu_fault_destroyed`` (routed NOTHING: the replacement of its work was the
``gpu_fault`` row's). A pass whose lease is not held writes nothing — the fence refuses every
write, the ledger's included, and the replica that holds the lease acts instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, exists, func, literal_column, or_, select, true

from gpufleet.common.db.enums import RUNNING_STATES, MachineState
from gpufleet.common.db.models import Attempt, Failure, Machine
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.detection_latency import gpu_fault_reported
from gpufleet.reaper.net_runner import ClaimingNet
from gpufleet.reaper.refusal import MachineSnapshot, NetGates, RefusalReason, Refuse, first_refusal
from gpufleet.reaper.snapshot import scan, state_in
from gpufleet.reaper.transition import Detection, destroy_transition

NAME = "gpu_fault"
DESTROY = destroy_transition(NAME)
# Running, or stopped with its broken GPU kept; a transitional machine is the
# stuck-transition net's until it lands.
ACTS_ON = frozenset({*RUNNING_STATES, MachineState.STOPPED})
CRITICAL = "critical"


@dataclass(frozen=True)
class GpuFaultPolicy:
    # How long attempts ended on the machine may keep their slots held (their processes
    # told to stop) before the destroy goes ahead regardless.
    slot_release_wait: timedelta = timedelta(minutes=2)

    @property
    def gates(self) -> NetGates:
        # No grace window, no report gate: see the module's docstring.
        return NetGates(net=NAME)


@dataclass(frozen=True)
class FaultedMachine:
    """What one scan read about a machine with GPU findings, beside its snapshot."""

    machine: MachineSnapshot
    findings: tuple[dict[str, Any], ...]
    # When the control plane first acted on the fault (its first ``gpu_fault`` row), else
    # when the findings were read; the slot wait and the detection latency count from it.
    faulted_at: datetime | None
    # Attempts ended on the machine whose processes it has not yet said are gone.
    held_slots: int = 0

    @property
    def critical(self) -> list[dict[str, Any]]:
        return [f for f in self.findings if f.get("severity") == CRITICAL]


@dataclass(frozen=True)
class DestroyMachine:
    machine_id: str
    details: str
    # The claim requires the slots still free that the scan saw free.
    slots_free: bool


def describe(finding: dict[str, Any]) -> str:
    name = f"xid {finding.get('code')}" if finding.get("kind") == "xid" else str(finding.get("kind"))
    gpu = finding.get("gpu_index", -1)
    where = "the machine" if not isinstance(gpu, int) or gpu < 0 else f"GPU {gpu}"
    return f"{name} on {where}"


def decide(now: datetime, faulted: FaultedMachine, policy: GpuFaultPolicy) -> DestroyMachine | Refuse | None:
    """Destroy, refuse (naming the gate), or nothing to do (warnings only, or a machine in
    a state this net does not act on)."""
    machine = faulted.machine
    critical = faulted.critical
    if not critical or machine.state not in ACTS_ON:
        return None
    reason = first_refusal(now, machine, policy.gates)
    if reason is not None:
        return Refuse(reason)
    waited = faulted.faulted_at is None or now >= faulted.faulted_at + policy.slot_release_wait
    if faulted.held_slots and not waited:
        return Refuse(RefusalReason.SLOT_HELD)
    what = ", ".join(describe(f) for f in critical)
    details = f"critical GPU finding ({what}): destroyed, not stopped, so its GPU never returns as capacity"
    if faulted.held_slots:
        details += (
            f"; {faulted.held_slots} ended attempt(s) still held a slot after "
            f"{int(policy.slot_release_wait.total_seconds())}s (a process wedged on the GPU: "
            "the destroy stops it)"
        )
    return DestroyMachine(machine.machine_id, details, slots_free=not faulted.held_slots)


def faulted_sql() -> ColumnElement[bool]:
    """A stored critical state, or a cordon (the scheduler cordons on every critical
    finding): the few rows worth reading the findings of. Written as
    ``ix_machines_gpu_faulted``'s predicate is (a literal, ``cordoned = true``), so the
    planner can prove the scan implies it."""
    return or_(Machine.gpu_health == literal_column(f"'{CRITICAL}'"), Machine.cordoned == true())


def no_slot_held() -> ColumnElement[bool]:
    return ~exists().where(Attempt.machine_id == Machine.id, Attempt.holds_slot.is_(True))


def stored_findings(value: object) -> tuple[dict[str, Any], ...]:
    """The stored findings, tolerating a row written by hand (anything not a finding skipped)."""
    if not isinstance(value, list):
        return ()
    return tuple(f for f in value if isinstance(f, dict))


class GpuFault(ClaimingNet[GpuFaultPolicy, FaultedMachine]):
    """Not a :class:`~gpufleet.reaper.net_runner.OneStepNet`: its decision reads more than
    a snapshot (the findings, the slots still held, when the fault was first acted on) and
    its refusals are written to the ledger, so only the constructor and the pass are the
    shared runner's."""

    name = NAME

    def due(self) -> list[ColumnElement[bool]]:
        return [state_in(ACTS_ON), faulted_sql()]

    def scan(self, now: datetime) -> list[FaultedMachine]:
        """The machines :meth:`due` selects, each with its findings, the slots still held and
        when the fault was first acted on (``now`` unused: a stored fault stays due)."""
        held = (
            select(func.count())
            .where(Attempt.machine_id == Machine.id, Attempt.holds_slot.is_(True))
            .correlate(Machine)
            .scalar_subquery()
        )
        first_fault = (
            select(func.min(Failure.at))
            .where(Failure.machine_id == Machine.id, Failure.failure_class == FailureClass.GPU_FAULT.value)
            .correlate(Machine)
            .scalar_subquery()
        )
        with self.sessions() as session:
            machines = scan(session, self.due())
            if not machines:
                return []
            extra = {
                row.id: row
                for row in session.execute(
                    select(
                        Machine.id,
                        Machine.gpu_findings,
                        Machine.gpu_health_at,
                        held.label("held"),
                        first_fault.label("first_fault"),
                    ).where(Machine.id.in_([m.machine_id for m in machines]))
                )
            }
        out: list[FaultedMachine] = []
        for m in machines:
            row = extra.get(m.machine_id)
            if row is None:
                continue  # destroyed between the two reads: nothing to decide
            out.append(
                FaultedMachine(
                    m,
                    stored_findings(row.gpu_findings),
                    gpu_fault_reported(row.first_fault, row.gpu_health_at),
                    int(row.held or 0),
                )
            )
        return out

    def act(self, now: datetime, machines: Sequence[FaultedMachine], decisions: DecisionLog) -> None:
        refused: list[tuple[FaultedMachine, RefusalReason]] = []
        for faulted in machines:
            decision = decide(now, faulted, self.policy)
            if isinstance(decision, Refuse):
                decisions.refused(faulted.machine.machine_id, decision.reason)
                refused.append((faulted, decision.reason))
            elif isinstance(decision, DestroyMachine):
                claimed = self.runner.execute(
                    DESTROY,
                    faulted.machine,
                    now,
                    decisions,
                    guards=[*self.due(), *([no_slot_held()] if decision.slots_free else [])],
                    clear_at_end=[Machine.stop_due_at, Machine.destroy_due_at],
                    call=self.provider.destroy,
                    detection=Detection(FailureClass.GPU_FAULT_DESTROYED, decision.details),
                    first_sign=faulted.faulted_at,
                )
                if not claimed and self.runner.calls.accepting:
                    refused.append((faulted, RefusalReason.CHANGED_SINCE_SCAN))
        if refused:
            self._record_refusals(now, refused)

    def _record_refusals(
        self, now: datetime, refused: Iterable[tuple[FaultedMachine, RefusalReason]]
    ) -> None:
        """One ledger row per machine when its refusal starts or changes reason."""
        rows = list(refused)
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            last: dict[str, str] = {}
            for machine_id, details in session.execute(
                select(Failure.machine_id, Failure.details)
                .where(
                    Failure.machine_id.in_([f.machine.machine_id for f, _ in rows]),
                    Failure.failure_class == FailureClass.GPU_FAULT_DESTROY_REFUSED.value,
                )
                .order_by(Failure.id)
            ):
                last[str(machine_id)] = details or ""
            for faulted, reason in rows:
                machine = faulted.machine
                if last.get(machine.machine_id, "").startswith(f"{reason.value}:"):
                    continue
                record_failure(
                    session,
                    now,
                    FailureClass.GPU_FAULT_DESTROY_REFUSED.value,
                    NAME,
                    machine_id=machine.machine_id,
                    details=f"{reason.value}: {_why_kept(faulted, reason)}",
                )


def _why_kept(faulted: FaultedMachine, reason: RefusalReason) -> str:
    what = ", ".join(describe(f) for f in faulted.critical)
    machine = faulted.machine
    why = {
        RefusalReason.NOT_OURS: "not provisioned and managed by this platform: it stays cordoned for a "
        "human to repair or deregister",
        RefusalReason.WORK_PINNED: f"{machine.live_attempts} live attempt(s) still hold it; they end "
        "through the ledger first",
        RefusalReason.SLOT_HELD: f"{faulted.held_slots} ended attempt(s) still hold a slot until the "
        "machine says their processes are gone (or the wait runs out)",
        RefusalReason.CHANGED_SINCE_SCAN: "the machine's row changed between the scan and the claim; "
        "decided again on the next pass",
    }.get(reason, reason.value)
    return f"{why}; critical GPU finding ({what}); the destroy waits"
