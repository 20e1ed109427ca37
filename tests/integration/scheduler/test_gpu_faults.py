"""A machine's heartbeat reports a GPU fault, through a real scheduler process on real
PostgreSQL: a critical finding cordons the machine, ends its attempts as our failure
(uncharged, the job requeued) and writes a gpu_fault ledger row; the same fault on a
second machine of the offering quarantines the offering; a warning only shows; a repeated
report acts once; a malformed report is refused naming its field."""

from __future__ import annotations

from datetime import UTC, datetime

import grpc
import pytest
from sqlalchemy import select

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.v1 import fleet_service_pb2, fleet_service_pb2_grpc, machine_pb2, worker_service_pb2
from gpufleet.v1 import worker_service_pb2_grpc as worker_grpc
from tests.support.fleet_rows import add_attempt, add_machine
from tests.support.procs import ServiceProcess

OFFERING = "sim-l4"
CRITICAL = machine_pb2.GPU_FINDING_SEVERITY_CRITICAL
WARNING = machine_pb2.GPU_FINDING_SEVERITY_WARNING


def health(state: int, *findings: tuple[str, int, int]) -> machine_pb2.GpuHealth:
    return machine_pb2.GpuHealth(
        state=state,
        findings=[
            machine_pb2.GpuFinding(
                kind=kind, severity=severity, gpu_index=0, code=code, message=f"{kind} {code}", count=1
            )
            for kind, code, severity in findings
        ],
    )


XID_79 = health(machine_pb2.GPU_HEALTH_STATE_CRITICAL, ("xid", 79, CRITICAL))


def heartbeat(
    scheduler: ServiceProcess, machine_id: str, gpu: machine_pb2.GpuHealth, running: list[str] | None = None
) -> worker_service_pb2.ReportHeartbeatResponse:
    with scheduler.channel(f"machine:{machine_id}") as channel:
        return worker_grpc.WorkerServiceStub(channel).ReportHeartbeat(  # type: ignore[no-any-return]
            worker_service_pb2.ReportHeartbeatRequest(
                machine_id=machine_id,
                running=[worker_service_pb2.RunningAttempt(attempt_id=a, slot=0) for a in running or []],
                gpu_health=gpu,
            ),
            timeout=10,
        )


def failures(sessions: object, machine_id: str) -> list[models.Failure]:
    with sessions() as s:  # type: ignore[operator]
        return list(
            s.scalars(
                select(models.Failure)
                .where(models.Failure.machine_id == machine_id)
                .order_by(models.Failure.id)
            )
        )


def test_a_critical_fault_cordons_ends_attempts_uncharged_and_a_repeat_quarantines(
    scheduler: ServiceProcess, pg_url: str
) -> None:
    sessions = make_sessionmaker(make_engine(pg_url))
    now = datetime.now(UTC)
    first = add_machine(sessions, now, offering_id=OFFERING)
    attempt_id = add_attempt(sessions, now, first)

    answer = heartbeat(scheduler, first, XID_79, running=[attempt_id])

    # The attempt goes back to the machine as a cancel: the control plane ended it.
    assert list(answer.cancel_attempt_ids) == [attempt_id]
    with sessions() as s:
        machine = s.get_one(models.Machine, first)
        attempt = s.get_one(models.Attempt, attempt_id)
        job = s.get_one(models.Job, attempt.job_id)
        quarantines = s.scalars(select(models.Quarantine)).all()
    assert machine.cordoned
    assert machine.gpu_health == "critical"
    assert [(f["kind"], f["code"]) for f in machine.gpu_findings or []] == [("xid", 79)]
    assert attempt.state not in ("RUNNING", "STARTING")
    assert (attempt.charged, attempt.charge_micros) == (False, 0)  # our failure
    assert job.state == "QUEUED"  # retried
    # Hardware: not the job's doing, so neither its own nor the patient budget is spent.
    assert (job.lost_retries_used, job.failure_retries_used, job.disruptions_used) == (0, 0, 1)
    rows = failures(sessions, first)
    assert [(r.failure_class, r.outcome, r.detector) for r in rows] == [
        ("gpu_fault", "REPLACE_MACHINE", "gpu_health")
    ]
    assert "[xid 79]" in rows[0].details and attempt_id in rows[0].details
    assert quarantines == []  # one machine is not a pattern

    # The worker repeats the agent's whole report every heartbeat: acted on once.
    heartbeat(scheduler, first, XID_79)
    assert len(failures(sessions, first)) == 1

    # The same fault on a second machine of the offering: the offering is quarantined.
    second = add_machine(sessions, now, offering_id=OFFERING)
    heartbeat(scheduler, second, XID_79)
    rows = failures(sessions, second)
    assert [(r.failure_class, r.outcome) for r in rows] == [
        ("gpu_fault", "REPLACE_MACHINE"),
        ("gpu_fault_repeated", "STOP_HARDWARE_CONFIG"),
    ]
    with sessions() as s:
        (quarantine,) = s.scalars(select(models.Quarantine)).all()
    assert (quarantine.kind, quarantine.offering_id, quarantine.cleared_at) == ("OFFERING", OFFERING, None)
    assert "gpu_fault_repeated" in quarantine.reason

    # GetMachine shows the health, as `gpufleet machines` does.
    with scheduler.channel() as channel:
        shown = fleet_service_pb2_grpc.FleetServiceStub(channel).GetMachine(
            fleet_service_pb2.GetMachineRequest(machine_id=first), timeout=10
        )
    assert shown.gpu_health.state == machine_pb2.GPU_HEALTH_STATE_CRITICAL
    assert [(f.kind, f.code, f.severity) for f in shown.gpu_health.findings] == [("xid", 79, CRITICAL)]
    assert shown.cordoned


def test_a_warning_is_shown_and_nothing_moves(scheduler: ServiceProcess, pg_url: str) -> None:
    sessions = make_sessionmaker(make_engine(pg_url))
    now = datetime.now(UTC)
    machine_id = add_machine(sessions, now, offering_id=OFFERING)
    attempt_id = add_attempt(sessions, now, machine_id)
    answer = heartbeat(
        scheduler,
        machine_id,
        health(machine_pb2.GPU_HEALTH_STATE_WARNING, ("xid", 13, WARNING)),
        [attempt_id],
    )
    assert list(answer.cancel_attempt_ids) == []
    with sessions() as s:
        machine = s.get_one(models.Machine, machine_id)
        attempt = s.get_one(models.Attempt, attempt_id)
    assert (machine.cordoned, machine.gpu_health) == (False, "warning")
    assert attempt.state == "RUNNING"
    assert failures(sessions, machine_id) == []


@pytest.mark.parametrize(
    ("finding", "field"),
    [
        (machine_pb2.GpuFinding(kind="", severity=CRITICAL), "gpu_health.findings[0].kind"),
        (machine_pb2.GpuFinding(kind="xid", severity=0), "gpu_health.findings[0].severity"),
        (
            machine_pb2.GpuFinding(kind="xid", severity=CRITICAL, message="x" * 501),
            "gpu_health.findings[0].message",
        ),
        (
            machine_pb2.GpuFinding(kind="xid", severity=CRITICAL, gpu_index=-2),
            "gpu_health.findings[0].gpu_index",
        ),
    ],
)
def test_a_malformed_report_is_refused_naming_its_field(
    scheduler: ServiceProcess, pg_url: str, finding: machine_pb2.GpuFinding, field: str
) -> None:
    sessions = make_sessionmaker(make_engine(pg_url))
    machine_id = add_machine(sessions, datetime.now(UTC))
    bad = machine_pb2.GpuHealth(state=machine_pb2.GPU_HEALTH_STATE_CRITICAL, findings=[finding])
    with pytest.raises(grpc.RpcError) as info:
        heartbeat(scheduler, machine_id, bad)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert field in info.value.details()  # type: ignore[attr-defined]
    with sessions() as s:
        assert s.get_one(models.Machine, machine_id).gpu_health is None  # nothing written
