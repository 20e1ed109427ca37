"""Ending the attempts of a machine that was lost, shared by every service that learns of
a loss (DESIGN §6).

A lost machine is never the tenant's fault: its live attempts end ``LOST`` and uncharged,
and each job goes back to the queue on its separate, more patient retry budget with a
doubling back-off — ``FAILED`` once that budget is spent, ``CANCELLED`` when a cancel was
already asked for. The scheduler learns of losses from leases that run out; the sweeper
learns of them from the provider's own list (a pre-empted spot instance, an instance that
vanished). Both write through here so a loss is accounted for the same way whoever saw it.

Everything here runs inside the caller's transaction (which the caller fences when it is
a leader); nothing here calls a provider or an agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import Table, func, select, update
from sqlalchemy.orm import Session

from gpufleet.common.db import models
from gpufleet.common.db.bulk import among, insert_rows
from gpufleet.common.db.enums import LIVE_ATTEMPT_STATES, TERMINAL_JOB_STATES, AttemptState, JobState

__all__ = [
    "LostAttempt",
    "end_attempt_lost",
    "end_live_attempts_lost",
    "requeue_after_loss",
    "set_job_state",
    "set_jobs_state",
]


@dataclass(frozen=True)
class LostAttempt:
    """One attempt ended by :func:`end_live_attempts_lost`, and where its job went (from
    ``job_state_before`` to ``job_state``: what the job outcomes are counted from)."""

    attempt_id: str
    job_id: str
    slot_seconds: float
    job_state: str
    kind_id: str
    job_state_before: str


def set_job_state(
    session: Session, job: models.Job, state: JobState, now: datetime, message: str = ""
) -> None:
    """Move ``job`` to ``state`` and append the event WatchJob streams. Every writer of a
    job's state (scheduler, sweeper, reaper) goes through here."""
    if job.state == state.value and not message:
        return
    job.state = state.value
    job.updated_at = now
    if message:
        job.status_message = message
    if state is JobState.RUNNING and job.started_at is None:
        job.started_at = now
    if state in TERMINAL_JOB_STATES:
        job.ended_at = now
    session.add(models.JobEvent(job_id=job.id, state=state.value, at=now, message=message))


def set_jobs_state(
    session: Session, job_ids: Sequence[str], from_: JobState, to: JobState, now: datetime, message: str
) -> list[str]:
    """:func:`set_job_state` for many jobs in two statements: those of ``job_ids`` still in
    ``from_`` move to ``to`` and get their event; returns the ids that moved. For the
    scheduler's batched writes, where one statement per job would cost the milliseconds."""
    if not job_ids:
        return []
    values: dict[str, object] = {"state": to.value, "updated_at": now, "status_message": message}
    if to is JobState.RUNNING:
        values["started_at"] = func.coalesce(models.Job.started_at, now)
    if to in TERMINAL_JOB_STATES:
        values["ended_at"] = now
    moved = list(
        session.execute(
            update(models.Job)
            .where(
                among(models.Job.id, job_ids, session.get_bind().dialect.name),
                models.Job.state == from_.value,
            )
            .values(values)
            .returning(models.Job.id)
            .execution_options(synchronize_session=False)
        ).scalars()
    )
    if moved:
        insert_rows(
            session.connection(),
            cast(Table, models.JobEvent.__table__),
            [{"job_id": job_id, "state": to.value, "at": now, "message": message} for job_id in moved],
        )
    return moved


def requeue_after_loss(
    session: Session, job: models.Job, kind: models.JobKind, now: datetime, backoff_s: float, why: str
) -> None:
    """Back to the queue on the separate, more patient budget; FAILED once it is spent."""
    if job.cancel_requested:
        set_job_state(session, job, JobState.CANCELLED, now, "cancelled")
        return
    if job.lost_retries_used < kind.lost_retry_budget:
        job.lost_retries_used += 1
        # Patient back-off: doubles with each loss.
        job.not_before = now + timedelta(seconds=backoff_s * (2 ** (job.lost_retries_used - 1)))
        set_job_state(
            session,
            job,
            JobState.QUEUED,
            now,
            f"{why}; requeued ({job.lost_retries_used} of {kind.lost_retry_budget}), not charged",
        )
    else:
        set_job_state(session, job, JobState.FAILED, now, f"{why}; lost-retry budget spent")


def end_attempt_lost(session: Session, attempt: models.Attempt, now: datetime, message: str) -> float:
    """End one attempt ``LOST``: its slot-seconds are recorded (elapsed time times the slots
    it held), nothing is charged and the job's charged totals do not move. Returns the
    slot-seconds."""
    slot_seconds = max(0.0, (now - attempt.started_at).total_seconds()) * attempt.slots
    attempt.state = AttemptState.LOST.value
    attempt.ended_at = now
    attempt.slot_seconds = slot_seconds
    attempt.charged = False
    attempt.charge_micros = 0
    attempt.status_message = message[:2000]
    return slot_seconds


def end_live_attempts_lost(
    session: Session, machine_id: str, now: datetime, *, why: str, lost_retry_backoff_s: float
) -> list[LostAttempt]:
    """End every live attempt on ``machine_id`` as ``LOST``, uncharged, and requeue each
    job (patient budget, doubling back-off from ``lost_retry_backoff_s``).

    The attempt and job rows are locked (``FOR UPDATE`` on PostgreSQL) so a completion
    arriving at the same moment either lands first — and the attempt is no longer live
    here — or waits for this transaction.
    """
    attempts = list(
        session.execute(
            select(models.Attempt)
            .where(
                models.Attempt.machine_id == machine_id,
                models.Attempt.state.in_([s.value for s in LIVE_ATTEMPT_STATES]),
            )
            .order_by(models.Attempt.started_at, models.Attempt.id)
            .with_for_update()
        ).scalars()
    )
    lost: list[LostAttempt] = []
    for attempt in attempts:
        job = session.execute(
            select(models.Job).where(models.Job.id == attempt.job_id).with_for_update()
        ).scalar_one()
        kind = session.get_one(models.JobKind, job.kind_id)
        before = job.state
        slot_seconds = end_attempt_lost(session, attempt, now, why)
        if job.state not in TERMINAL_JOB_STATES:
            requeue_after_loss(session, job, kind, now, lost_retry_backoff_s, why)
        lost.append(LostAttempt(attempt.id, job.id, slot_seconds, job.state, job.kind_id, before))
    session.flush()
    return lost
