"""A machine's certificate speaks for that machine only, through a real scheduler process
on real PostgreSQL: reporting for another machine, completing another's attempt or
registering under another name is refused, and changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import grpc
import pytest
from sqlalchemy import func, select

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.v1 import job_pb2, machine_pb2, worker_service_pb2, worker_service_pb2_grpc
from tests.support.fleet_rows import add_attempt, add_machine
from tests.support.procs import ServiceProcess


def refused(call: object, code: grpc.StatusCode) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    assert info.value.code() == code, info.value  # type: ignore[attr-defined]


def test_a_machine_cannot_report_or_complete_for_another(scheduler: ServiceProcess, pg_url: str) -> None:
    sessions = make_sessionmaker(make_engine(pg_url))
    now = datetime.now(UTC)
    mine, theirs = add_machine(sessions, now), add_machine(sessions, now)
    attempt = add_attempt(sessions, now, theirs)
    with sessions() as s:
        before = s.get_one(models.Machine, theirs).worker_report_at
        lease_before = s.get_one(models.Attempt, attempt).lease_expires_at

    with scheduler.channel(f"machine:{mine}") as channel:
        stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
        refused(
            lambda: stub.ReportHeartbeat(
                worker_service_pb2.ReportHeartbeatRequest(
                    machine_id=theirs, running=[worker_service_pb2.RunningAttempt(attempt_id=attempt, slot=0)]
                ),
                timeout=10,
            ),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        done = worker_service_pb2.ReportCompletionRequest(
            machine_id=theirs, attempt_id=attempt, outcome=job_pb2.ATTEMPT_STATE_SUCCEEDED, slot_seconds=60
        )
        refused(lambda: stub.ReportCompletion(done, timeout=10), grpc.StatusCode.PERMISSION_DENIED)
        # Naming itself does not help: the attempt is another machine's.
        done.machine_id = mine
        refused(lambda: stub.ReportCompletion(done, timeout=10), grpc.StatusCode.FAILED_PRECONDITION)
        # Its own heartbeat is served.
        stub.ReportHeartbeat(worker_service_pb2.ReportHeartbeatRequest(machine_id=mine), timeout=10)

    with sessions() as s:
        other = s.get_one(models.Machine, theirs)
        row = s.get_one(models.Attempt, attempt)
        assert other.worker_report_at == before
        assert row.state == "RUNNING" and row.lease_expires_at == lease_before and not row.charged
        assert s.get_one(models.Machine, mine).worker_report_at is not None


def register(**fields: object) -> worker_service_pb2.RegisterMachineRequest:
    base: dict[str, object] = {
        "request_id": "reg-1",
        "agent_address": "127.0.0.1:50060",
        "pool": "l4",
        "slots": 1,
        "workload_class": machine_pb2.WORKLOAD_CLASS_REPORTING,
    }
    return worker_service_pb2.RegisterMachineRequest(**{**base, **fields})  # type: ignore[arg-type]


def test_a_box_registers_as_the_machine_its_certificate_names(scheduler: ServiceProcess, pg_url: str) -> None:
    sessions = make_sessionmaker(make_engine(pg_url))
    with scheduler.channel("machine:box-7") as box, scheduler.channel("operator") as operator:
        stub = worker_service_pb2_grpc.WorkerServiceStub(box)
        refused(
            lambda: stub.RegisterMachine(register(machine_id="box-8"), timeout=10),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        refused(
            lambda: worker_service_pb2_grpc.WorkerServiceStub(operator).RegisterMachine(
                register(), timeout=10
            ),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        with sessions() as s:
            assert s.execute(select(func.count()).select_from(models.Machine)).scalar_one() == 0
        made = stub.RegisterMachine(register(), timeout=10)
    assert made.machine_id == "box-7"
    assert made.origin == machine_pb2.MACHINE_ORIGIN_REGISTERED
