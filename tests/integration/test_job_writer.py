"""The job lifecycle's one writer on the real stores (PostgreSQL and SQLite): what an ended
attempt leaves in the rows — the attempt's state and charge, the job's state, counters,
back-off and event — for our failures and the tenant's, a move the table refuses, an
attempt already ended, and the batched compare-and-set."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.attempts import end_live_attempts_lost
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.enums import JobState
from gpufleet.common.db.models import Attempt, Job, JobEvent
from gpufleet.common.job_lifecycle import EndCause, IllegalJobTransition, Mover, RetryPolicy
from gpufleet.common.job_outcomes import OutcomeTally
from gpufleet.common.job_writer import end_attempt, move_jobs
from tests.support.fleet_rows import add_attempt, add_machine

NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
POLICY = RetryPolicy(retry_backoff_s=10.0, lost_retry_backoff_s=30.0)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def dispatching_job(sessions: sessionmaker[Session], job_id: str) -> None:
    """Put a job back to DISPATCHING as the assign step leaves it (its StartJob unanswered)."""
    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id).values(state=JobState.DISPATCHING.value))


def running_attempt(sessions: sessionmaker[Session]) -> str:
    machine_id = add_machine(sessions, NOW)
    return add_attempt(sessions, NOW - timedelta(minutes=10), machine_id)


def rows(sessions: sessionmaker[Session], attempt_id: str) -> tuple[Attempt, Job, list[str]]:
    with sessions() as s:
        attempt = s.get_one(Attempt, attempt_id)
        job = s.get_one(Job, attempt.job_id)
        events = list(s.execute(select(JobEvent.message).where(JobEvent.job_id == job.id)).scalars())
        s.expunge_all()
        return attempt, job, events


def end(
    sessions: sessionmaker[Session], attempt_id: str, cause: EndCause, by: Mover, **kw: object
) -> OutcomeTally:
    tally = OutcomeTally()
    with sessions() as s, s.begin():
        attempt = s.get_one(Attempt, attempt_id, with_for_update=True)
        end_attempt(s, attempt, cause, NOW, by=by, policy=POLICY, tally=tally, **kw)  # type: ignore[arg-type]
    return tally


def test_a_gpu_fault_is_our_failure_uncharged_and_a_disruption(sessions: sessionmaker[Session]) -> None:
    attempt_id = running_attempt(sessions)
    tally = end(sessions, attempt_id, EndCause.GPU_FAULT, Mover.GPU_HEALTH)
    attempt, job, events = rows(sessions, attempt_id)
    assert (attempt.state, attempt.charged, attempt.charge_micros, attempt.holds_slot) == (
        "INFRA_ERROR",
        False,
        0,
        True,  # its process may still run on the cordoned machine until its worker says it is gone
    )
    assert attempt.slot_seconds == pytest.approx(600.0)
    assert (job.state, job.lost_retries_used, job.failure_retries_used, job.charge_micros) == (
        "QUEUED",
        0,
        0,
        0,
    )
    assert job.disruptions_used == 1
    assert job.not_before is not None and job.not_before.replace(tzinfo=UTC) == NOW + timedelta(seconds=30)
    assert events == [
        "GPU fault on its machine; requeued (disruption 1 of 20, not counted against its retries), "
        "not charged"
    ]
    assert (dict(tally.retried), dict(tally.lost)) == ({("clip", "gpu_fault"): 1}, {})


def test_the_tenants_failure_is_charged_and_spends_an_ordinary_retry(sessions: sessionmaker[Session]) -> None:
    attempt_id = running_attempt(sessions)
    tally = end(sessions, attempt_id, EndCause.JOB_FAILED, Mover.WORKER, exit_code=2, slot_seconds=500.0)
    attempt, job, events = rows(sessions, attempt_id)
    assert (attempt.state, attempt.charged, attempt.slot_seconds) == ("FAILED", True, 500.0)
    assert attempt.charge_micros > 0 and job.charge_micros == attempt.charge_micros
    assert (job.state, job.failure_retries_used, job.lost_retries_used) == ("QUEUED", 1, 0)
    assert job.not_before is not None and job.not_before.replace(tzinfo=UTC) == NOW + timedelta(seconds=10)
    assert events == ["attempt failed (exit 2); retry 1 of 2"]
    assert dict(tally.retried) == {("clip", "job_failed"): 1}


def test_a_lease_run_out_ends_the_attempt_lost_and_counts_it(sessions: sessionmaker[Session]) -> None:
    attempt_id = running_attempt(sessions)
    tally = end(sessions, attempt_id, EndCause.LEASE_EXPIRED, Mover.LEASE_EXPIRY)
    attempt, job, events = rows(sessions, attempt_id)
    assert (attempt.state, attempt.charged, job.state, job.lost_retries_used) == ("LOST", False, "QUEUED", 1)
    assert events == ["machine lost (lease expired); requeued (1 of 5), not charged"]
    assert dict(tally.lost) == {"clip": 1}
    assert dict(tally.retried) == {("clip", "lease_expired"): 1}


def test_a_mover_the_table_does_not_name_is_refused_and_nothing_is_written(
    sessions: sessionmaker[Session],
) -> None:
    attempt_id = running_attempt(sessions)
    with pytest.raises(IllegalJobTransition, match="request_watchdog may not end an attempt as gpu_fault"):
        end(sessions, attempt_id, EndCause.GPU_FAULT, Mover.REQUEST_WATCHDOG)
    attempt, job, events = rows(sessions, attempt_id)
    assert (attempt.state, job.state, events) == ("RUNNING", "RUNNING", [])


def test_an_attempt_already_ended_is_not_ended_again(sessions: sessionmaker[Session]) -> None:
    attempt_id = running_attempt(sessions)
    end(sessions, attempt_id, EndCause.SUCCEEDED, Mover.WORKER, slot_seconds=60.0)
    with pytest.raises(IllegalJobTransition, match="already ended"):
        end(sessions, attempt_id, EndCause.LEASE_EXPIRED, Mover.LEASE_EXPIRY)
    attempt, job, events = rows(sessions, attempt_id)
    assert (attempt.state, job.state, events) == ("SUCCEEDED", "SUCCEEDED", ["succeeded"])


def test_a_machine_replaced_for_a_gpu_fault_ends_its_attempts_as_that(
    sessions: sessionmaker[Session],
) -> None:
    machine_id = add_machine(sessions, NOW)
    attempt_id = add_attempt(sessions, NOW - timedelta(minutes=1), machine_id)
    with sessions() as s, s.begin():
        ended = end_live_attempts_lost(
            s,
            machine_id,
            NOW,
            why="machine replaced (gpu_fault, by scheduler)",
            lost_retry_backoff_s=30.0,
            cause=EndCause.GPU_FAULT,
        )
    assert [(a.attempt_id, a.job_state_before, a.job_state) for a in ended] == [
        (attempt_id, "RUNNING", "QUEUED")
    ]
    attempt, job, events = rows(sessions, attempt_id)
    assert (attempt.state, attempt.charged, job.lost_retries_used, job.disruptions_used) == (
        "INFRA_ERROR",
        False,
        0,
        1,
    )
    assert events == [
        "machine replaced (gpu_fault, by scheduler); requeued (disruption 1 of 20, not counted against its "
        "retries), not charged"
    ]


def test_the_batched_move_is_a_compare_and_set(sessions: sessionmaker[Session]) -> None:
    first = running_attempt(sessions)
    second = running_attempt(sessions)
    with sessions() as s, s.begin():
        jobs = [s.get_one(Attempt, a).job_id for a in (first, second)]
    dispatching_job(sessions, jobs[0])
    with sessions() as s, s.begin():
        moved = move_jobs(
            s, jobs, JobState.DISPATCHING, JobState.RUNNING, NOW, by=Mover.DISPATCH, message="running"
        )
    assert moved == [jobs[0]]  # the second was RUNNING already: not moved, no event
    with pytest.raises(IllegalJobTransition):
        with sessions() as s, s.begin():
            move_jobs(s, jobs, JobState.RUNNING, JobState.SUCCEEDED, NOW, by=Mover.DISPATCH, message="x")
