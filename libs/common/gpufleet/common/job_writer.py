"""The one writer of jobs' and attempts' states: it applies the job lifecycle's decisions
(:mod:`gpufleet.common.job_lifecycle`) in SQL, inside the caller's transaction.

Every service that ends an attempt — the worker's completion, the fleet tick's limits and
lease expiry, the dispatch take-back, a cancel, the machine-loss path, a GPU fault — calls
:func:`end_attempt`: the move is checked against the table, :func:`decide_attempt_end`
decides, and this module writes the attempt (state, slot-seconds, charge), the job (state,
counters, back-off, event) and notes both in the caller's :class:`OutcomeTally`. The
callers hold the attempt row locked (``FOR UPDATE``) and have checked it is still live,
as before; a second writer that raced them finds it ended and changes nothing.

Job moves without an attempt (a request watchdog failing or resetting a waiting job, the
dispatch's starts) go through :func:`move_job` / :func:`move_jobs`, checked the same way.
Nothing here calls a provider or an agent, and nothing commits.
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
from gpufleet.common.job_lifecycle import (
    EndCause,
    IllegalJobTransition,
    JobCounters,
    JobUpdate,
    Mover,
    RetryPolicy,
    charge_micros,
    check_attempt_move,
    check_cause,
    check_job_move,
    decide_attempt_end,
)
from gpufleet.common.job_outcomes import OutcomeTally

__all__ = [
    "Ended",
    "attempt_charge_micros",
    "attempts_running",
    "counters_of",
    "end_attempt",
    "move_job",
    "move_jobs",
    "set_job_state",
    "start_attempt_running",
]


@dataclass(frozen=True)
class Ended:
    """One attempt ended by :func:`end_attempt`: the decision applied, and the job's state
    before it (what the job outcomes are counted from)."""

    update: JobUpdate
    job: models.Job
    job_state_before: str
    slot_seconds: float


def attempt_charge_micros(slot_seconds: float, machine: models.Machine, plan: models.Plan) -> int:
    """slot-seconds x (machine's hourly price / its slots) x the plan's rate
    (:func:`~gpufleet.common.job_lifecycle.charge_micros`, the rule the simulator runs too)."""
    return charge_micros(slot_seconds, machine.hourly_price_micros, machine.slots, plan.rate_micros)


def counters_of(job: models.Job, kind: models.JobKind) -> JobCounters:
    return JobCounters(
        state=JobState(job.state),
        failure_retries_used=job.failure_retries_used,
        lost_retries_used=job.lost_retries_used,
        retry_budget=kind.retry_budget,
        lost_retry_budget=kind.lost_retry_budget,
        cancel_requested=bool(job.cancel_requested),
        disruptions_used=job.disruptions_used or 0,
    )


def set_job_state(
    session: Session, job: models.Job, state: JobState, now: datetime, message: str = ""
) -> None:
    """Write ``job``'s state and append the event WatchJob streams; unchecked — the moves
    go through :func:`move_job` and :func:`end_attempt`, which check them first. A call
    with the job's own state and a message only adds an event (a note in its history)."""
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


def move_job(
    session: Session, job: models.Job, to: JobState, now: datetime, *, by: Mover, message: str
) -> None:
    """Move a job (loaded, and locked by the caller) to ``to``: checked against the table."""
    check_job_move(JobState(job.state), to, by)
    set_job_state(session, job, to, now, message)


def move_jobs(
    session: Session,
    job_ids: Sequence[str],
    from_: JobState,
    to: JobState,
    now: datetime,
    *,
    by: Mover,
    message: str,
) -> list[str]:
    """:func:`move_job` for many jobs in two statements: those of ``job_ids`` still in
    ``from_`` (compare-and-set) move to ``to`` and get their event; returns the ids that
    moved. For the scheduler's batched writes, where a statement per job would cost."""
    check_job_move(from_, to, by)
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


def start_attempt_running(attempt: models.Attempt, *, by: Mover) -> None:
    """A STARTING attempt (loaded, and locked by the caller) runs: its worker says so."""
    check_attempt_move(AttemptState(attempt.state), AttemptState.RUNNING, by)
    attempt.state = AttemptState.RUNNING.value


def attempts_running(session: Session, attempt_ids: Sequence[str], *, by: Mover) -> int:
    """STARTING attempts of ``attempt_ids`` move to RUNNING (compare-and-set); how many."""
    check_attempt_move(AttemptState.STARTING, AttemptState.RUNNING, by)
    if not attempt_ids:
        return 0
    result = session.execute(
        update(models.Attempt)
        .where(
            among(models.Attempt.id, attempt_ids, session.get_bind().dialect.name),
            models.Attempt.state == AttemptState.STARTING.value,
        )
        .values(state=AttemptState.RUNNING.value)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def end_attempt(
    session: Session,
    attempt: models.Attempt,
    cause: EndCause,
    now: datetime,
    *,
    by: Mover,
    policy: RetryPolicy,
    why: str = "",
    exit_code: int = 0,
    slot_seconds: float | None = None,
    message: str = "",
    tally: OutcomeTally | None = None,
    tally_class: str | None = None,
) -> Ended:
    """End the live ``attempt`` (loaded and locked by the caller) by ``cause`` and move its
    job as :func:`decide_attempt_end` says.

    ``slot_seconds``: measured by the worker, or elapsed since the attempt started times
    the slots it held. A charged end is priced at the machine's rate and the plan's; the
    job's charged totals grow by it. Whether its slot stays held until the machine's worker
    reports the process gone is the cause's rule (``EndRule.holds_slot``), not the caller's.
    ``message``: the attempt's own status words (``why`` is the job's). ``tally`` notes the
    job's move under ``tally_class`` (default: the rule's ledger class, else the cause's
    name — ``gpu_fault`` is the ledger's class too) and a lost attempt.
    """
    rule = check_cause(cause, by)
    if attempt.state not in LIVE_ATTEMPT_STATES:
        raise IllegalJobTransition(f"attempt {attempt.id} already ended ({attempt.state})")
    check_attempt_move(AttemptState(attempt.state), rule.attempt_state, by)
    job = session.get_one(models.Job, attempt.job_id)
    kind = session.get_one(models.JobKind, job.kind_id)
    before = job.state
    decided = decide_attempt_end(cause, counters_of(job, kind), policy, why=why, exit_code=exit_code)

    attempt.state = decided.attempt_state.value
    attempt.ended_at = now
    if slot_seconds is None:
        slot_seconds = max(0.0, (now - attempt.started_at).total_seconds()) * attempt.slots
    attempt.slot_seconds = slot_seconds
    attempt.charged = decided.charged
    attempt.holds_slot = decided.holds_slot
    attempt.charge_micros = 0
    if message:
        attempt.status_message = message[:2000]
    if decided.charged:
        machine = session.get_one(models.Machine, attempt.machine_id)
        plan = session.execute(
            select(models.Plan)
            .join(models.Workspace, models.Workspace.plan_id == models.Plan.id)
            .where(models.Workspace.id == job.workspace_id)
        ).scalar_one()
        attempt.charge_micros = attempt_charge_micros(slot_seconds, machine, plan)
        job.slot_seconds += slot_seconds
        job.charge_micros += attempt.charge_micros

    if decided.job_state is not None:
        check_job_move(JobState(before), decided.job_state, by)
        job.failure_retries_used = decided.failure_retries_used
        job.lost_retries_used = decided.lost_retries_used
        job.disruptions_used = decided.disruptions_used
        if decided.backoff_s is not None:
            job.not_before = now + timedelta(seconds=decided.backoff_s)
        set_job_state(session, job, decided.job_state, now, decided.message)
    if tally is not None:
        if decided.lost:
            tally.attempt_lost(job.kind_id)
        tally.job_moved(job.kind_id, before, job.state, tally_class or decided.ledger_class or cause.value)
    return Ended(decided, job, before, slot_seconds)
