"""The failure ledger and its routing table (DESIGN §5).

Every detection lands in one append-only table and routes, through :data:`ROUTES`, to
one fixed outcome. A class the table does not know routes to ALERT_HUMAN — never to a
retry: retrying an unclassified permanent failure spends real money to reach the same
answer.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from gpufleet.common.db.enums import IncidentState, LedgerOutcome
from gpufleet.common.db.models import Failure, Incident
from sqlalchemy import select
from sqlalchemy.orm import Session


class FailureClass(StrEnum):
    PROVISION_TIMEOUT = "provision_timeout"
    BOOT_FAILED = "boot_failed"
    WENT_SILENT = "went_silent"
    MACHINE_LOST = "machine_lost"
    ORPHAN_FOUND = "orphan_found"
    PREEMPTED = "preempted"
    STOCKOUT = "stockout"
    QUOTA_EXCEEDED = "quota_exceeded"
    AUTH_FAILED = "auth_failed"
    PROVIDER_CALL_FAILED = "provider_call_failed"
    TRANSITION_STUCK = "transition_stuck"
    SLOT_NOT_CLOSED = "slot_not_closed"
    JOB_FAILED = "job_failed"
    JOB_INFRA_ERROR = "job_infra_error"
    JOB_TIMED_OUT = "job_timed_out"
    LEASE_EXPIRED = "lease_expired"


ROUTES: dict[FailureClass, LedgerOutcome] = {
    FailureClass.PROVISION_TIMEOUT: LedgerOutcome.REPLACE_MACHINE,
    FailureClass.BOOT_FAILED: LedgerOutcome.REPLACE_MACHINE,
    FailureClass.WENT_SILENT: LedgerOutcome.REPLACE_MACHINE,
    FailureClass.MACHINE_LOST: LedgerOutcome.NOTHING,
    FailureClass.ORPHAN_FOUND: LedgerOutcome.NOTHING,
    FailureClass.PREEMPTED: LedgerOutcome.REPLACE_MACHINE,
    FailureClass.STOCKOUT: LedgerOutcome.STOP_HARDWARE_CONFIG,
    FailureClass.QUOTA_EXCEEDED: LedgerOutcome.HALT_PROVISIONING,
    FailureClass.AUTH_FAILED: LedgerOutcome.HALT_PROVISIONING,
    FailureClass.PROVIDER_CALL_FAILED: LedgerOutcome.ALERT_HUMAN,
    FailureClass.TRANSITION_STUCK: LedgerOutcome.ALERT_HUMAN,
    FailureClass.SLOT_NOT_CLOSED: LedgerOutcome.RETRY_SAME_MACHINE,
    FailureClass.JOB_FAILED: LedgerOutcome.FAIL_JOB,
    FailureClass.JOB_INFRA_ERROR: LedgerOutcome.RETRY_SAME_MACHINE,
    FailureClass.JOB_TIMED_OUT: LedgerOutcome.FAIL_JOB,
    FailureClass.LEASE_EXPIRED: LedgerOutcome.NOTHING,
}

# Classes that open an incident whatever they route to: a human should hear of them.
INCIDENT_CLASSES = frozenset({FailureClass.STOCKOUT, FailureClass.QUOTA_EXCEEDED, FailureClass.AUTH_FAILED})


def route(failure_class: str) -> LedgerOutcome:
    """The outcome for a class; anything unknown alerts a human."""
    try:
        return ROUTES[FailureClass(failure_class)]
    except ValueError:
        return LedgerOutcome.ALERT_HUMAN


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
) -> Failure:
    """Append one ledger row (and an incident when the class calls for one)."""
    outcome = route(failure_class)
    row = Failure(
        at=now,
        machine_id=machine_id,
        job_id=job_id,
        attempt_id=attempt_id,
        failure_class=failure_class,
        detector=detector,
        details=details,
        outcome=outcome.value,
    )
    session.add(row)
    wants_incident = outcome is LedgerOutcome.ALERT_HUMAN or failure_class in INCIDENT_CLASSES
    if wants_incident:
        open_incident(
            session,
            now,
            failure_class,
            details or failure_class,
            machine_id=machine_id,
            job_id=job_id,
            dedupe_key=incident_key,
        )
    session.flush()
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
