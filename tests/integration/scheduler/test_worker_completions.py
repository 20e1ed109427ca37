"""WorkerService.ReportCompletion through a real scheduler process and real PostgreSQL: a
slot whose walls could not be built lands in the ledger as its own class, is never
charged, and puts the job back in the queue to run again."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.v1 import job_pb2, worker_service_pb2, worker_service_pb2_grpc
from tests.support.fleet_rows import add_attempt, add_machine
from tests.support.procs import ServiceProcess


@pytest.mark.parametrize(
    ("slot_not_closed", "failure_class"),
    [(True, "slot_could_not_be_closed"), (False, "job_infra_error")],
)
def test_an_infra_error_is_recorded_by_its_cause_uncharged_and_requeued(
    scheduler: ServiceProcess, pg_url: str, slot_not_closed: bool, failure_class: str
) -> None:
    sessions = make_sessionmaker(make_engine(pg_url))
    now = datetime.now(UTC)
    machine_id = add_machine(sessions, now)
    attempt_id = add_attempt(sessions, now, machine_id)
    with scheduler.channel(f"machine:{machine_id}") as channel:
        worker_service_pb2_grpc.WorkerServiceStub(channel).ReportCompletion(
            worker_service_pb2.ReportCompletionRequest(
                machine_id=machine_id,
                attempt_id=attempt_id,
                outcome=job_pb2.ATTEMPT_STATE_INFRA_ERROR,
                slot_seconds=12.0,
                message="slot could not be closed off: cgroup: permission denied",
                slot_not_closed=slot_not_closed,
            ),
            timeout=10,
        )
    with sessions() as s:
        attempt = s.get_one(models.Attempt, attempt_id)
        job = s.get_one(models.Job, attempt.job_id)
        rows = s.scalars(select(models.Failure).where(models.Failure.attempt_id == attempt_id)).all()
    assert (attempt.state, attempt.charged, attempt.charge_micros) == ("INFRA_ERROR", False, 0)
    assert job.state == "QUEUED"  # retried, on the patient budget, on whatever slot is free next
    assert [r.failure_class for r in rows] == [failure_class]
    assert "slot could not be closed" in rows[0].details
