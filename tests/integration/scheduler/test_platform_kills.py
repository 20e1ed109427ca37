"""Who pays for a killed attempt, through a real scheduler process and real PostgreSQL.

A runner reports a job the platform killed (a slot's wipe, its machine stopping) as
INFRA_ERROR with the platform's reason and ``disrupted``: never charged, and never counted
against the job's retry budgets — neither its own nor the patient one — only against the
wide disruption bound. An INFRA_ERROR the platform cannot explain (a pipeline that would
not start) spends the patient budget. The job's own death — a non-zero exit, ``kill -9 $$``, the kernel
killing it at its memory limit — is FAILED: charged, and it spends a retry. The platform's
own stops for a cancel or a time limit end the job as CANCELLED or TIMED_OUT, never
FAILED, and spend no retry either.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.v1 import (
    job_pb2,
    job_service_pb2,
    job_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from tests.support.fleet_rows import add_attempt, add_machine
from tests.support.procs import ServiceProcess

PLATFORM_KILL = "killed by the platform (slot 0 wiped for attempt 7c0e), exit 137"


def report(
    scheduler: ServiceProcess,
    machine_id: str,
    attempt_id: str,
    outcome: int,
    exit_code: int,
    message: str,
    disrupted: bool = False,
) -> None:
    with scheduler.channel(f"machine:{machine_id}") as channel:
        worker_service_pb2_grpc.WorkerServiceStub(channel).ReportCompletion(
            worker_service_pb2.ReportCompletionRequest(
                machine_id=machine_id,
                attempt_id=attempt_id,
                outcome=outcome,
                exit_code=exit_code,
                slot_seconds=600.0,
                message=message,
                disrupted=disrupted,
            ),
            timeout=10,
        )


@pytest.mark.parametrize(
    ("outcome", "exit_code", "message", "charged", "job_state", "own_retries", "patient_retries", "ledger"),
    [
        (job_pb2.ATTEMPT_STATE_INFRA_ERROR, 137, PLATFORM_KILL, False, "QUEUED", 0, 0, "job_infra_error"),
        (
            job_pb2.ATTEMPT_STATE_INFRA_ERROR,
            0,
            "the job could not start: no pipeline 'p1'",
            False,
            "QUEUED",
            0,
            1,
            "job_infra_error",
        ),
        (
            job_pb2.ATTEMPT_STATE_FAILED,
            137,
            "the job was killed by SIGKILL",
            True,
            "QUEUED",
            1,
            0,
            "job_failed",
        ),
        (
            job_pb2.ATTEMPT_STATE_FAILED,
            137,
            "the job was killed by SIGKILL at its memory limit (out of memory)",
            True,
            "QUEUED",
            1,
            0,
            "job_failed",
        ),
        (job_pb2.ATTEMPT_STATE_FAILED, 3, "the job exited with code 3", True, "QUEUED", 1, 0, "job_failed"),
        (
            job_pb2.ATTEMPT_STATE_TIMED_OUT,
            143,
            "stopped at the attempt's time limit",
            True,
            "TIMED_OUT",
            0,
            0,
            "job_timed_out",
        ),
    ],
    ids=["platform-kill", "unexplained-infra-error", "own-sigkill", "own-oom", "own-exit", "time-limit"],
)
def test_a_kill_the_platform_made_is_never_the_tenants(
    scheduler: ServiceProcess,
    pg_url: str,
    outcome: int,
    exit_code: int,
    message: str,
    charged: bool,
    job_state: str,
    own_retries: int,
    patient_retries: int,
    ledger: str,
) -> None:
    sessions = make_sessionmaker(make_engine(pg_url))
    now = datetime.now(UTC)
    machine_id = add_machine(sessions, now)
    attempt_id = add_attempt(sessions, now, machine_id)
    disrupted = message == PLATFORM_KILL  # as the agent says it (gpufleet.agent.verdict)
    report(scheduler, machine_id, attempt_id, outcome, exit_code, message, disrupted)
    with sessions() as s:
        attempt = s.get_one(models.Attempt, attempt_id)
        job = s.get_one(models.Job, attempt.job_id)
        rows = s.scalars(select(models.Failure).where(models.Failure.attempt_id == attempt_id)).all()
    assert job.disruptions_used == (1 if disrupted else 0)
    assert attempt.charged is charged
    assert (attempt.charge_micros > 0) is charged
    assert (job.charge_micros > 0) is charged
    assert job.state == job_state
    assert (job.failure_retries_used, job.lost_retries_used) == (own_retries, patient_retries)
    assert [r.failure_class for r in rows] == [ledger]
    assert message in rows[0].details


def test_a_cancel_ends_the_job_cancelled_and_spends_no_retry(scheduler: ServiceProcess, pg_url: str) -> None:
    """The runner's kill for a cancel arrives after CancelJob ended the attempt: it changes
    nothing, and nothing reads it as the job's own failure."""
    sessions = make_sessionmaker(make_engine(pg_url))
    now = datetime.now(UTC)
    machine_id = add_machine(sessions, now)
    attempt_id = add_attempt(sessions, now, machine_id)
    with sessions() as s:
        job_id = s.get_one(models.Attempt, attempt_id).job_id
    with scheduler.channel("operator") as channel:
        job_service_pb2_grpc.JobServiceStub(channel).CancelJob(
            job_service_pb2.CancelJobRequest(job_id=job_id, reason="not needed"), timeout=10
        )
    report(
        scheduler, machine_id, attempt_id, job_pb2.ATTEMPT_STATE_CANCELLED, 143, "cancelled: job cancelled"
    )
    report(
        scheduler, machine_id, attempt_id, job_pb2.ATTEMPT_STATE_FAILED, 137, "the job was killed by SIGKILL"
    )
    with sessions() as s:
        attempt = s.get_one(models.Attempt, attempt_id)
        job = s.get_one(models.Job, job_id)
        rows = s.scalars(select(models.Failure).where(models.Failure.attempt_id == attempt_id)).all()
    assert (attempt.state, job.state) == ("CANCELLED", "CANCELLED")
    assert (job.failure_retries_used, job.lost_retries_used) == (0, 0)
    assert rows == []  # no failure of the job's in the ledger
