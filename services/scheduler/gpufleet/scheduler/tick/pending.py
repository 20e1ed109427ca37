"""Why a queued job waits, in the fleet tick's own words (``Job.pending_reason``, issue 24).

The reasons are given by the code that decides not to start a job, where it decides it:
:func:`~gpufleet.scheduler.tick.decide.eligible_demand` (the plan's cap), the scale step
(a machine on its way, a ceiling, no usable offering, the films' share cap, a drain), and
the snapshot's held-back jobs (a paused workspace, a dispatch back-off, older jobs of the
workspace first). This module only builds each reason's words and compares them with what
is recorded: a reason is written when it changes, not every tick.

Messages carry nothing that moves from tick to tick (no count of running jobs, no "in 3
minutes"): an unchanged situation reads the same, so it costs no write.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from enum import StrEnum

from gpufleet.scheduler.tick.model import (
    FleetSnapshot,
    HeldBackJob,
    JobView,
    MachineView,
    OfferingView,
    Pending,
    PendingChange,
    Policy,
)


class PendingReason(StrEnum):
    """``gpufleet.v1.PendingReason`` without its ``PENDING_REASON_`` prefix, as stored."""

    WORKSPACE_PAUSED = "WORKSPACE_PAUSED"
    PLAN_CONCURRENCY_LIMIT = "PLAN_CONCURRENCY_LIMIT"
    WAITING_FOR_CAPACITY = "WAITING_FOR_CAPACITY"
    POOL_AT_CEILING = "POOL_AT_CEILING"
    OFFERING_QUARANTINED = "OFFERING_QUARANTINED"
    FILMS_SHARE_CAP = "FILMS_SHARE_CAP"
    WAITING_FOR_DRAIN = "WAITING_FOR_DRAIN"
    DISPATCH_BACKOFF = "DISPATCH_BACKOFF"
    QUEUE_WAIT_DEADLINE_NEAR = "QUEUE_WAIT_DEADLINE_NEAR"


R = PendingReason
# Job id -> why it waits, filled in as the decision goes.
Why = dict[str, Pending]


def _at(t: datetime) -> str:
    return f"{t:%Y-%m-%d %H:%M:%S} UTC"


def workspace_paused(workspace_id: str) -> Pending:
    return Pending(R.WORKSPACE_PAUSED, f"workspace {workspace_id} is paused; it starts once it is resumed")


def plan_limit(workspace_id: str, limit: int) -> Pending:
    """The same words whether the workspace's own running jobs fill its plan or older jobs
    of it take the places first: from the job's side it is one wait, and it reads alike."""
    return Pending(
        R.PLAN_CONCURRENCY_LIMIT,
        f"workspace {workspace_id} runs at most {limit} job(s) at once (its plan); "
        "it starts when an earlier one ends",
    )


def waiting_for_capacity(pool_id: str, ready_at: datetime | None) -> Pending:
    when = f", expected to take work at {_at(ready_at)}" if ready_at is not None else ""
    return Pending(
        R.WAITING_FOR_CAPACITY, f"a machine of pool {pool_id} is on its way for it{when}", ready_at
    )


def pool_at_ceiling(pool_id: str, max_machines: int) -> Pending:
    return Pending(
        R.POOL_AT_CEILING,
        f"pool {pool_id} holds its most machines ({max_machines}) and none has room for it",
    )


def fleet_at_ceiling(max_running: int) -> Pending:
    return Pending(
        R.POOL_AT_CEILING,
        f"the fleet runs its most machines ({max_running}) and none in its pool has room for it",
    )


def no_usable_offering(pool_id: str, snapshot: FleetSnapshot) -> Pending:
    """Which of the pool's offerings cannot be bought, and why (quarantined, its region
    halted, no provider here serves it)."""
    offerings = [o for o in snapshot.offerings if o.pool_id == pool_id]
    if not offerings:
        return Pending(R.OFFERING_QUARANTINED, f"pool {pool_id} lists no offering to add a machine from")
    return Pending(
        R.OFFERING_QUARANTINED,
        f"no machine can be added to pool {pool_id}: "
        + "; ".join(f"{o.id} {_unusable(o, snapshot)}" for o in sorted(offerings, key=lambda o: o.id)),
    )


def _unusable(offering: OfferingView, snapshot: FleetSnapshot) -> str:
    if offering.id in snapshot.quarantined_offerings:
        return "is quarantined"
    if (offering.provider, offering.region) in snapshot.halted_regions:
        return f"is in a halted region ({offering.provider} {offering.region})"
    return "is served by no provider here"


def films_share_cap(pool_id: str, share: float) -> Pending:
    return Pending(
        R.FILMS_SHARE_CAP,
        f"films already hold {share:.0%} of pool {pool_id}'s machines while short jobs wait",
    )


def waiting_for_drain(machine_id: str, ends_at: datetime) -> Pending:
    return Pending(
        R.WAITING_FOR_DRAIN,
        f"machine {machine_id} is draining for it; its jobs are expected to end by {_at(ends_at)}",
    )


def held_for_it(machine_id: str) -> Pending:
    """A film's machine is ready but not taking work yet (its worker has not reported, or
    its agent backs off)."""
    return Pending(R.WAITING_FOR_CAPACITY, f"machine {machine_id} is held for it and not taking work yet")


def dispatch_backoff(until: datetime | None) -> Pending:
    when = f" until {_at(until)}" if until is not None else ""
    return Pending(
        R.DISPATCH_BACKOFF,
        f"its last attempt did not run to an end (it could not start, or its machine was lost); "
        f"it waits{when} before its next dispatch",
    )


def expected_ready(machine: MachineView, snapshot: FleetSnapshot, policy: Policy) -> datetime | None:
    """When a machine on its way is expected to take work: when it began arriving (as the
    leader saw it, else its last state change) plus its offering's typical boot."""
    began = snapshot.arriving_since.get(machine.id) or machine.state_changed_at
    if began is None:
        return None
    return ready_after(began, boot_s(machine.offering_id, snapshot, policy), snapshot.now)


def boot_s(offering_id: str | None, snapshot: FleetSnapshot, policy: Policy) -> float:
    if offering_id is None:
        return policy.typical_boot_s
    return snapshot.typical_boot_s.get(offering_id, policy.typical_boot_s)


def ready_after(began: datetime, boot_s: float, now: datetime) -> datetime:
    """``began`` plus a typical boot; once that has passed, the next whole boot after it —
    an estimate that moves a boot at a time (one write), not every tick. Whole seconds."""
    boot = timedelta(seconds=max(boot_s, 1.0))
    at = began + boot
    if at <= now:
        at += boot * ((now - at) // boot + 1)
    return at.replace(microsecond=0) + (timedelta(seconds=1) if at.microsecond else timedelta())


def held_back(job: HeldBackJob, snapshot: FleetSnapshot, policy: Policy) -> Pending:
    """A held-back job's reason, first that holds: near its deadline, its workspace
    paused, its back-off, its plan's places taken by older jobs. The snapshot reads such
    a job only while its recorded reason is not this one (the same order, in SQL)."""
    if not job.workspace_active:
        first = workspace_paused(job.workspace_id)
    elif job.not_before is not None and job.not_before > snapshot.now:
        first = dispatch_backoff(job.not_before)
    else:
        first = plan_limit(job.workspace_id, snapshot.workspace_limits.get(job.workspace_id, 0))
    return near_deadline(first, job.waiting_since, job.queue_wait_deadline_s, snapshot.now, policy)


def near_deadline(
    first: Pending, waiting_since: datetime | None, deadline_s: float, now: datetime, policy: Policy
) -> Pending:
    """``first``, or QUEUE_WAIT_DEADLINE_NEAR naming it once the job has waited
    ``deadline_near_share`` of its kind's queue-wait deadline (the expected ready time goes:
    the proto sets it only with WAITING_FOR_CAPACITY; the words keep it)."""
    if waiting_since is None or deadline_s <= 0:
        return first
    if now < waiting_since + timedelta(seconds=deadline_s * policy.deadline_near_share):
        return first
    fails_at = waiting_since + timedelta(seconds=deadline_s)
    return Pending(
        R.QUEUE_WAIT_DEADLINE_NEAR,
        f"{first.message} — and its queue-wait deadline is near: not started by {_at(fails_at)}, it fails",
    )


def changes(
    queued: Iterable[JobView | HeldBackJob],
    why: Why,
    assigned: Collection[str],
    snapshot: FleetSnapshot,
    policy: Policy,
) -> list[PendingChange]:
    """What to write: each job looked at and not assigned whose reason (near its deadline
    or not) differs from the one recorded. An assigned job's reason is cleared by its
    assignment's own write."""
    out: list[PendingChange] = []
    # When a wait begun then is near its deadline, per deadline (a few kinds, many jobs).
    near_from: dict[float, datetime] = {}
    for job in queued:
        if job.id in assigned:
            continue
        new = why.get(job.id)
        if new is not None and isinstance(job, JobView) and job.waiting_since is not None:
            deadline = job.queue_wait_deadline_s
            if (cutoff := near_from.get(deadline)) is None:
                cutoff = near_from[deadline] = snapshot.now - timedelta(
                    seconds=deadline * policy.deadline_near_share
                )
            if deadline > 0 and job.waiting_since <= cutoff:
                new = near_deadline(new, job.waiting_since, deadline, snapshot.now, policy)
        if new != job.pending:
            before = job.pending.reason if job.pending is not None else None
            out.append(PendingChange(job.id, new, (new.reason if new is not None else None) != before))
    return out
