"""The failure ledger, its routing table, and where each outcome takes effect (DESIGN §5).

Every detection lands in one append-only table and routes, through :data:`ROUTES`, to
one fixed outcome. A class the table does not know routes to ALERT_HUMAN — never to a
retry: retrying an unclassified permanent failure spends real money to reach the same
answer.

:func:`apply_outcome` is the one place an outcome takes effect:

- ``NOTHING`` — the row is the record; nothing else moves.
- ``RETRY_SAME_MACHINE`` / ``FAIL_JOB`` — the job-level routes: they name what the job
  lifecycle (:mod:`gpufleet.common.job_lifecycle`) does for the attempt's end that the row
  records — back to the queue on a retry budget (any machine, despite the wire name;
  FAILED once spent), or ended. The writer that ends the attempt applies it through the
  lifecycle's one writer; here they change nothing, so a class routed to them can never
  end a job twice. A test holds the two tables together.
- ``REPLACE_MACHINE`` — the machine's live attempts end ``LOST`` (``INFRA_ERROR`` for a
  ``gpu_fault``: :func:`replace_cause`) and uncharged and their jobs go back to the queue
  (:func:`gpufleet.common.attempts.end_live_attempts_lost`), counted as lost (a GPU
  fault's are not), retried under the row's class, or finished
  (:mod:`gpufleet.common.job_outcomes`).
  The machine itself is already leaving (destroyed, destroying, or gone at the provider)
  and no longer counts as arriving capacity, so the scheduler's scale step sees the
  requeued jobs as unmet demand and provisions a replacement.
- ``STOP_HARDWARE_CONFIG`` — the machine's offering is quarantined, for a TTL or until a
  human clears it; the scale step skips it.
- ``HALT_PROVISIONING`` — the machine's provider/region is quarantined the same way.
- ``ALERT_HUMAN`` — an incident opens (so do the classes in :data:`INCIDENT_CLASSES`).

:func:`record_failure` always opens the incidents its class calls for; it applies the
rest only when asked (``apply=True``), because some writers (the scheduler's job
completions) apply the job-level outcomes themselves and must not have them applied twice.

Each row written is counted in ``gpufleet.ledger.failures`` by class and outcome, and each
replacement's attempts and jobs in the job outcomes — when the transaction commits, never
before: the writers own their transactions, and a count for a row that was rolled back (a
fenced leader's pass, a failed commit) would be a row that does not exist. See
:func:`gpufleet.common.db.when_committed.when_committed`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.orm import Session

from gpufleet.common.attempts import LostAttempt, end_live_attempts_lost
from gpufleet.common.db.enums import AttemptState, IncidentState, LedgerOutcome, QuarantineKind
from gpufleet.common.db.models import Failure, Incident, Machine, Quarantine
from gpufleet.common.db.when_committed import when_committed
from gpufleet.common.job_lifecycle import EndCause
from gpufleet.common.job_outcomes import JobOutcomes, OutcomeTally
from gpufleet.common.metrics.catalog import LEDGER_FAILURES
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.outcome_policy import OutcomePolicy as OutcomePolicy


class FailureClass(StrEnum):
    PROVISION_TIMEOUT = "provision_timeout"
    BOOT_FAILED = "boot_failed"
    WENT_SILENT = "went_silent"
    # The lost detector's mark: unreachable, but still there; nothing moves (DESIGN §4).
    MACHINE_LOST = "machine_lost"
    # The provider no longer runs an instance we wanted running (vanished, or stopped by
    # someone else): its work is gone, as after a pre-emption.
    INSTANCE_GONE = "instance_gone"
    # The machine halted itself: its agent's dead-man switch, idle with no word from the
    # control plane for its limit. Not a pre-emption (the offering's record is untouched).
    MACHINE_STOPPED_ITSELF = "machine_stopped_itself"
    ORPHAN_FOUND = "orphan_found"
    PREEMPTED = "preempted"
    # A spot machine the cloud *stopped* (GCE's instanceTerminationAction=STOP, EC2's
    # interruption behaviour "stop"): a pre-emption whose instance and disk remain. Its work
    # is replaced; the machine is kept STOPPED as warm capacity the scale step may restart.
    SPOT_STOPPED = "spot_stopped"
    # The provider started a spot machine recorded stopped again by itself (EC2 restarts an
    # interrupted persistent spot instance when capacity returns): the machine follows it.
    SPOT_RESTARTED = "spot_restarted"
    # A machine missing from its provider's list within the grace after its create: kept,
    # neither dropped nor re-created, and looked for again on the next list.
    NOT_YET_LISTED = "not_yet_listed"
    # A destroy call answered, and the provider does not show the instance gone yet (EC2
    # shutting-down, a GCE delete still running): the machine stays DESTROYING, re-read.
    DESTROY_UNCONFIRMED = "destroy_unconfirmed"
    # A machine's heartbeat reported a critical GPU finding (an Xid such as 79, an
    # uncorrectable ECC error, a row remap failure, a lost GPU, a failed initialisation):
    # the machine is cordoned and replaced, its attempts ended as our failure.
    GPU_FAULT = "gpu_fault"
    # The same GPU fault on machines of one offering within the window: the offering goes.
    GPU_FAULT_REPEATED = "gpu_fault_repeated"
    # The reaper's gpu_fault net claimed the destroy of a machine with a critical finding
    # (destroyed, not stopped: a stopped machine keeps its broken GPU).
    GPU_FAULT_DESTROYED = "gpu_fault_destroyed"
    # The gpu_fault net declined that destroy (written when the reason starts or changes).
    GPU_FAULT_DESTROY_REFUSED = "gpu_fault_destroy_refused"
    STOCKOUT = "stockout"
    QUOTA_EXCEEDED = "quota_exceeded"
    AUTH_FAILED = "auth_failed"
    PROVIDER_CALL_FAILED = "provider_call_failed"
    # The provisioner does not run this provider (or region): nothing can be created there
    # until an operator configures it.
    PROVIDER_NOT_SERVED = "provider_not_served"
    TRANSITION_STUCK = "transition_stuck"
    # The stuck-transition net sent a stop or destroy again (the row is written first).
    TRANSITION_REISSUED = "transition_reissued"
    SLOT_NOT_CLOSED = "slot_could_not_be_closed"
    JOB_FAILED = "job_failed"
    JOB_INFRA_ERROR = "job_infra_error"
    JOB_TIMED_OUT = "job_timed_out"
    LEASE_EXPIRED = "lease_expired"
    # The scheduler's request-level watchdogs.
    QUEUE_WAIT_TIMEOUT = "queue_wait_timeout"
    NO_CONSUMER = "no_consumer"
    DISPATCH_STUCK = "dispatch_stuck"
    PAID_WAIT = "paid_wait"
    POOL_IDLE_RELEASE = "pool_idle_release"


ROUTES: dict[FailureClass, LedgerOutcome] = {
    FailureClass.PROVISION_TIMEOUT: LedgerOutcome.REPLACE_MACHINE,
    FailureClass.BOOT_FAILED: LedgerOutcome.REPLACE_MACHINE,
    FailureClass.WENT_SILENT: LedgerOutcome.REPLACE_MACHINE,
    FailureClass.MACHINE_LOST: LedgerOutcome.NOTHING,
    FailureClass.INSTANCE_GONE: LedgerOutcome.REPLACE_MACHINE,
    # Whatever the control plane still thought ran there is ended and requeued, as for any
    # machine that is gone; the machine follows the provider (stopped, disk kept).
    FailureClass.MACHINE_STOPPED_ITSELF: LedgerOutcome.REPLACE_MACHINE,
    FailureClass.ORPHAN_FOUND: LedgerOutcome.NOTHING,
    FailureClass.PREEMPTED: LedgerOutcome.REPLACE_MACHINE,
    FailureClass.SPOT_STOPPED: LedgerOutcome.REPLACE_MACHINE,
    # The machine is BOOTING again, for the nets and the money chain; the row is the record.
    FailureClass.SPOT_RESTARTED: LedgerOutcome.NOTHING,
    # The record is the act: nothing moves while the list catches up with the create.
    FailureClass.NOT_YET_LISTED: LedgerOutcome.NOTHING,
    # Nothing moves: the stuck-transition net reads it again; past its limit it alerts.
    FailureClass.DESTROY_UNCONFIRMED: LedgerOutcome.NOTHING,
    FailureClass.GPU_FAULT: LedgerOutcome.REPLACE_MACHINE,
    FailureClass.GPU_FAULT_REPEATED: LedgerOutcome.STOP_HARDWARE_CONFIG,
    # The destroy is the whole act; its work was replaced by the gpu_fault row.
    FailureClass.GPU_FAULT_DESTROYED: LedgerOutcome.NOTHING,
    # The row is the record; the net decides again next pass.
    FailureClass.GPU_FAULT_DESTROY_REFUSED: LedgerOutcome.NOTHING,
    FailureClass.STOCKOUT: LedgerOutcome.STOP_HARDWARE_CONFIG,
    FailureClass.QUOTA_EXCEEDED: LedgerOutcome.HALT_PROVISIONING,
    FailureClass.AUTH_FAILED: LedgerOutcome.HALT_PROVISIONING,
    FailureClass.PROVIDER_CALL_FAILED: LedgerOutcome.ALERT_HUMAN,
    FailureClass.PROVIDER_NOT_SERVED: LedgerOutcome.HALT_PROVISIONING,
    FailureClass.TRANSITION_STUCK: LedgerOutcome.ALERT_HUMAN,
    # The re-issued call is the whole act; the row is its record (and counts re-issues).
    FailureClass.TRANSITION_REISSUED: LedgerOutcome.NOTHING,
    FailureClass.SLOT_NOT_CLOSED: LedgerOutcome.RETRY_SAME_MACHINE,
    # The tenant's own failure: retried on the kind's budget, FAILED once it is spent.
    FailureClass.JOB_FAILED: LedgerOutcome.RETRY_SAME_MACHINE,
    FailureClass.JOB_INFRA_ERROR: LedgerOutcome.RETRY_SAME_MACHINE,
    FailureClass.JOB_TIMED_OUT: LedgerOutcome.FAIL_JOB,
    # Our failure: the attempt ends LOST and the job is retried on the patient budget.
    FailureClass.LEASE_EXPIRED: LedgerOutcome.RETRY_SAME_MACHINE,
    # The watchdog fails the job where it records the row (the scheduler owns jobs).
    FailureClass.QUEUE_WAIT_TIMEOUT: LedgerOutcome.FAIL_JOB,
    FailureClass.NO_CONSUMER: LedgerOutcome.FAIL_JOB,
    # The reset is the whole act; the row is its record.
    FailureClass.DISPATCH_STUCK: LedgerOutcome.NOTHING,
    FailureClass.PAID_WAIT: LedgerOutcome.ALERT_HUMAN,
    # The release is the whole act; the row is its record (no machine is touched).
    FailureClass.POOL_IDLE_RELEASE: LedgerOutcome.NOTHING,
}

# Classes that open an incident whatever they route to: a human should hear of them.
INCIDENT_CLASSES = frozenset(
    {
        FailureClass.STOCKOUT,
        FailureClass.QUOTA_EXCEEDED,
        FailureClass.AUTH_FAILED,
        FailureClass.PROVIDER_NOT_SERVED,
    }
)


@dataclass(frozen=True)
class OutcomeTarget:
    """What an outcome acts on when the ledger row names no machine (e.g. a failed create).

    Any field left empty is read from the row's machine.
    """

    offering_id: str | None = None
    provider: str | None = None
    region: str | None = None


@dataclass
class AppliedOutcome:
    """What :func:`apply_outcome` did, for the caller's log and tests."""

    outcome: LedgerOutcome
    lost_attempts: list[LostAttempt] = field(default_factory=list)
    quarantine: Quarantine | None = None
    incident: Incident | None = None


def route(failure_class: str) -> LedgerOutcome:
    """The outcome for a class; anything unknown alerts a human."""
    try:
        return ROUTES[FailureClass(failure_class)]
    except ValueError:
        return LedgerOutcome.ALERT_HUMAN


def wants_incident(failure_class: str) -> bool:
    return route(failure_class) is LedgerOutcome.ALERT_HUMAN or failure_class in INCIDENT_CLASSES


def record_failure(
    session: Session,
    now: datetime,
    failure_class: str,
    detector: str,
    *,
    machine_id: str | None = None,
    job_id: str | None = None,
    attempt_id: str | None = None,
    details: str = "",
    incident_key: str | None = None,
    apply: bool = False,
    policy: OutcomePolicy | None = None,
    target: OutcomeTarget | None = None,
    instruments: Instruments = PROCESS,
) -> Failure:
    """Append one ledger row and open the incident its class calls for.

    With ``apply=True`` the routed outcome also takes effect (:func:`apply_outcome`), in
    the caller's transaction. The row is counted in ``instruments`` once that transaction
    commits.
    """
    if apply:
        row, _ = record_and_apply(
            session,
            now,
            failure_class,
            detector,
            machine_id=machine_id,
            job_id=job_id,
            attempt_id=attempt_id,
            details=details,
            incident_key=incident_key,
            policy=policy,
            target=target,
            instruments=instruments,
        )
        return row
    row = _append(session, now, failure_class, detector, machine_id, job_id, attempt_id, details, instruments)
    if wants_incident(failure_class):
        _alert(session, now, row, incident_key)
    session.flush()
    return row


def record_and_apply(
    session: Session,
    now: datetime,
    failure_class: str,
    detector: str,
    *,
    machine_id: str | None = None,
    job_id: str | None = None,
    attempt_id: str | None = None,
    details: str = "",
    incident_key: str | None = None,
    policy: OutcomePolicy | None = None,
    target: OutcomeTarget | None = None,
    instruments: Instruments = PROCESS,
) -> tuple[Failure, AppliedOutcome]:
    """:func:`record_failure` with its outcome applied, returning what the outcome did
    (the attempts it ended, the quarantine, the incident) for the caller's log.

    A ``REPLACE_MACHINE`` row names the attempts it ended and where their jobs went: they
    are ended first, in the same transaction, so the append-only row can say so."""
    policy = policy or OutcomePolicy()
    lost: list[LostAttempt] = []
    replace = route(failure_class) is LedgerOutcome.REPLACE_MACHINE and machine_id is not None
    if replace:
        assert machine_id is not None
        lost = _replace(session, now, machine_id, failure_class, detector, policy, instruments)
        ended = ", ".join(f"{a.attempt_id} (job {a.job_id} -> {a.job_state})" for a in lost)
        details = f"{details}; attempts ended lost, uncharged: {ended or 'none'}"
    row = _append(session, now, failure_class, detector, machine_id, job_id, attempt_id, details, instruments)
    applied = apply_outcome(
        session,
        now,
        row,
        policy=policy,
        target=target,
        incident_key=incident_key,
        replaced=replace,
        instruments=instruments,
    )
    applied.lost_attempts = lost
    return row, applied


def _replace(
    session: Session,
    now: datetime,
    machine_id: str,
    failure_class: str,
    detector: str,
    policy: OutcomePolicy,
    instruments: Instruments,
) -> list[LostAttempt]:
    """End the machine's live attempts and count them, and their jobs, once committed: a
    net that replaces the same machine again finds nothing live, so counts nothing."""
    lost = end_live_attempts_lost(
        session,
        machine_id,
        now,
        why=f"machine replaced ({failure_class}, by {detector})",
        lost_retry_backoff_s=policy.lost_retry_backoff_s,
        disruption_budget=policy.disruption_budget,
        cause=replace_cause(failure_class),
    )
    tally = OutcomeTally()
    for attempt in lost:
        if attempt.attempt_state == AttemptState.LOST.value:  # a GPU fault's is not a loss
            tally.attempt_lost(attempt.kind_id)
        tally.job_moved(attempt.kind_id, attempt.job_state_before, attempt.job_state, failure_class)
    if tally:
        when_committed(session, functools.partial(JobOutcomes(instruments).committed, tally))
    return lost


# The replacements whose reason the cloud gave: the job on the machine cannot have caused
# them (a slot holds no cloud credentials), so they spend the disruption budget.
RECLAIMED_CLASSES = frozenset({FailureClass.PREEMPTED, FailureClass.SPOT_STOPPED, FailureClass.INSTANCE_GONE})


def replace_cause(failure_class: str) -> EndCause:
    """How a replaced machine's attempts end: a GPU fault ends them as that (our failure,
    INFRA_ERROR, not the job's doing); a machine the cloud took back as RECLAIMED (LOST,
    not the job's doing); any other replacement as a lost machine (LOST: the machine went
    dark, which a job might have caused)."""
    if failure_class == EndCause.GPU_FAULT.value:
        return EndCause.GPU_FAULT
    if failure_class in {c.value for c in RECLAIMED_CLASSES}:
        return EndCause.RECLAIMED
    return EndCause.MACHINE_LOST


def _append(
    session: Session,
    now: datetime,
    failure_class: str,
    detector: str,
    machine_id: str | None,
    job_id: str | None,
    attempt_id: str | None,
    details: str,
    instruments: Instruments,
) -> Failure:
    row = Failure(
        at=now,
        machine_id=machine_id,
        job_id=job_id,
        attempt_id=attempt_id,
        failure_class=failure_class,
        detector=detector,
        details=details,
        outcome=route(failure_class).value,
    )
    session.add(row)
    session.flush()
    when_committed(
        session,
        functools.partial(
            instruments.counter(LEDGER_FAILURES).add,
            1,
            {"failure_class": failure_class, "outcome": row.outcome},
        ),
    )
    return row


@dataclass(frozen=True)
class QuarantineEffect:
    """A quarantine to put in force: an offering, or a provider's region (``region`` ""
    for the whole provider); ``ttl`` None until a human clears it."""

    kind: QuarantineKind
    ttl: timedelta | None
    offering_id: str | None = None
    provider: str | None = None
    region: str | None = None


@dataclass(frozen=True)
class LedgerEffect:
    """What a routed outcome does, as one update that the SQL applier
    (:func:`apply_outcome`) and the simulator both apply (issue #26 item 1): end the
    machine's live attempts, put a quarantine in force, open an incident."""

    outcome: LedgerOutcome
    replace_machine: bool = False
    quarantine: QuarantineEffect | None = None
    incident: bool = False


def decide_effect(
    failure_class: str,
    outcome: LedgerOutcome,
    policy: OutcomePolicy,
    target: OutcomeTarget,
    *,
    on_machine: bool,
) -> LedgerEffect:
    """The effect of ``outcome`` for a row of ``failure_class`` on ``target`` (its fields
    already filled from the row's machine, if any; ``on_machine``: the row names one)."""
    quarantine = None
    if outcome is LedgerOutcome.STOP_HARDWARE_CONFIG and target.offering_id:
        quarantine = QuarantineEffect(
            QuarantineKind.OFFERING, policy.offering_quarantine_ttl, offering_id=target.offering_id
        )
    elif outcome is LedgerOutcome.HALT_PROVISIONING and target.provider:
        quarantine = QuarantineEffect(
            QuarantineKind.PROVIDER_REGION,
            policy.halt_ttl,
            provider=target.provider,
            region=target.region or "",
        )
    return LedgerEffect(
        outcome,
        replace_machine=outcome is LedgerOutcome.REPLACE_MACHINE and on_machine,
        quarantine=quarantine,
        incident=wants_incident(failure_class) or outcome is LedgerOutcome.ALERT_HUMAN,
    )


def apply_outcome(
    session: Session,
    now: datetime,
    failure: Failure,
    *,
    policy: OutcomePolicy | None = None,
    target: OutcomeTarget | None = None,
    incident_key: str | None = None,
    replaced: bool = False,
    instruments: Instruments = PROCESS,
) -> AppliedOutcome:
    """Make ``failure``'s routed outcome take effect, inside the caller's transaction.

    Idempotent where it matters: a quarantine already in force for the same offering (or
    provider/region) is reused, an incident with the same ``incident_key`` is not opened
    twice, and only live attempts are ended (``replaced``: they were, just before the row
    was written). The attempts it ends are counted in ``instruments`` once the caller's
    transaction commits.
    """
    policy = policy or OutcomePolicy()
    target = target or OutcomeTarget()
    outcome = _stored_outcome(failure)
    applied = AppliedOutcome(outcome)
    machine = session.get(Machine, failure.machine_id) if failure.machine_id else None
    effect = decide_effect(
        failure.failure_class,
        outcome,
        policy,
        OutcomeTarget(
            target.offering_id or (machine.offering_id if machine is not None else None),
            target.provider or (machine.provider if machine is not None else None),
            target.region if target.region is not None else (machine.region if machine is not None else ""),
        ),
        on_machine=machine is not None,
    )
    if effect.replace_machine and machine is not None and not replaced:
        applied.lost_attempts = _replace(
            session, now, machine.id, failure.failure_class, failure.detector, policy, instruments
        )
    if effect.quarantine is not None:
        q = effect.quarantine
        applied.quarantine = _quarantine(
            session,
            now,
            q.ttl,
            f"{failure.failure_class} (ledger {failure.id}): {failure.details}",
            kind=q.kind,
            offering_id=q.offering_id,
            provider=q.provider,
            region=q.region,
        )
    if effect.incident:
        applied.incident = _alert(session, now, failure, incident_key)
    session.flush()
    return applied


def _stored_outcome(failure: Failure) -> LedgerOutcome:
    # The outcome decided when the row was written, even if the table changed since.
    try:
        return LedgerOutcome(failure.outcome)
    except ValueError:
        return route(failure.failure_class)


def _alert(session: Session, now: datetime, failure: Failure, incident_key: str | None) -> Incident | None:
    return open_incident(
        session,
        now,
        failure.failure_class,
        failure.details or failure.failure_class,
        machine_id=failure.machine_id,
        job_id=failure.job_id,
        dedupe_key=incident_key,
    )


def in_force(expires_at: datetime | None, now: datetime) -> bool:
    """Whether a quarantine or halt no human has cleared still holds at ``now``: it has no
    expiry (it holds until a human clears it) or expires after ``now``. One in force is kept
    as it is, never extended, when the same outcome comes again. :func:`in_force_sql` is the
    same predicate for a query; the simulator reads this one."""
    return expires_at is None or expires_at > now


def in_force_sql(now: datetime) -> list[ColumnElement[bool]]:
    """:func:`in_force` as a query's WHERE (with the row not cleared): the one form every
    reader of the quarantines in force uses (the fleet tick's snapshot, the reaper's API and
    gauges, the ledger itself)."""
    return [
        Quarantine.cleared_at.is_(None),
        or_(Quarantine.expires_at.is_(None), Quarantine.expires_at > now),
    ]


def _quarantine(
    session: Session,
    now: datetime,
    ttl: timedelta | None,
    reason: str,
    *,
    kind: QuarantineKind,
    offering_id: str | None = None,
    provider: str | None = None,
    region: str | None = None,
) -> Quarantine:
    """The quarantine in force for this target, or a new one."""
    query = select(Quarantine).where(Quarantine.kind == kind.value, *in_force_sql(now))
    if kind is QuarantineKind.OFFERING:
        query = query.where(Quarantine.offering_id == offering_id)
    else:
        query = query.where(Quarantine.provider == provider, Quarantine.region == region)
    existing = session.execute(query.order_by(Quarantine.id).limit(1)).scalar_one_or_none()
    if existing is not None:
        return existing
    row = Quarantine(
        kind=kind.value,
        offering_id=offering_id,
        provider=provider,
        region=region,
        reason=reason[:2000],
        created_at=now,
        expires_at=now + ttl if ttl is not None else None,
    )
    session.add(row)
    return row


def open_incident(
    session: Session,
    now: datetime,
    failure_class: str,
    summary: str,
    *,
    machine_id: str | None = None,
    job_id: str | None = None,
    dedupe_key: str | None = None,
) -> Incident | None:
    """Open an incident; with a ``dedupe_key`` at most one is ever opened for it."""
    if dedupe_key is not None:
        existing = session.execute(
            select(Incident.id).where(Incident.dedupe_key == dedupe_key)
        ).scalar_one_or_none()
        if existing is not None:
            return None
    incident = Incident(
        at=now,
        failure_class=failure_class,
        machine_id=machine_id,
        job_id=job_id,
        summary=summary,
        state=IncidentState.OPEN.value,
        dedupe_key=dedupe_key,
    )
    session.add(incident)
    return incident
