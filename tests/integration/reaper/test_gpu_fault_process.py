"""The GPU-fault net in the real reaper process (``python -m gpufleet.reaper``) on real
PostgreSQL: the machines' heartbeats go to a real scheduler process, which stores each
finding and cordons on a critical one; the reaper destroys through the real
ProvisionerService with its sim driver, over TLS.

Seen as an operator would: the machine whose GPU fell off the bus is DESTROYED and its
instance gone at the provider, with its gpu_fault and gpu_fault_destroyed rows; the one
with a warning runs on untouched; a registered box with the same fault and a machine a
live attempt still pins are kept, each with one refusal row naming why."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import RealClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.provisioner.drivers.base import InstanceStatus
from gpufleet.v1 import machine_pb2, reaper_service_pb2, reaper_service_pb2_grpc, worker_service_pb2
from gpufleet.v1 import worker_service_pb2_grpc as worker_grpc
from tests.support.fleet_rows import add_attempt, add_machine
from tests.support.procs import ServiceProcess, start_service
from tests.support.sim_provisioner import SimProvisioner, serve_sim_provisioner

CRITICAL = machine_pb2.GPU_FINDING_SEVERITY_CRITICAL
WARNING = machine_pb2.GPU_FINDING_SEVERITY_WARNING


def health(state: int, severity: int, code: int) -> machine_pb2.GpuHealth:
    return machine_pb2.GpuHealth(
        state=state,
        findings=[machine_pb2.GpuFinding(kind="xid", severity=severity, gpu_index=0, code=code, message="m")],
    )


XID_79 = health(machine_pb2.GPU_HEALTH_STATE_CRITICAL, CRITICAL, 79)
XID_13 = health(machine_pb2.GPU_HEALTH_STATE_WARNING, WARNING, 13)
STORED_XID_79 = [{"kind": "xid", "severity": "critical", "gpu_index": 0, "code": 79, "message": "m"}]


@pytest.fixture
def sim() -> Iterator[SimProvisioner]:
    with serve_sim_provisioner(RealClock()) as sim:
        yield sim


@pytest.fixture
def scheduler(pg_url: str, tmp_path: Path) -> Iterator[ServiceProcess]:
    # No machine is bought: the test's machines are rows, and the provisioner is nowhere.
    svc = start_service(
        "scheduler",
        tmp_path,
        {
            "GPUFLEET_DATABASE_URL": pg_url,
            "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:9",
            "GPUFLEET_MAX_RUNNING_MACHINES": "0",
        },
    )
    yield svc
    svc.stop()


def heartbeat(scheduler: ServiceProcess, machine_id: str, gpu: machine_pb2.GpuHealth) -> None:
    with scheduler.channel(f"machine:{machine_id}") as channel:
        worker_grpc.WorkerServiceStub(channel).ReportHeartbeat(
            worker_service_pb2.ReportHeartbeatRequest(machine_id=machine_id, gpu_health=gpu), timeout=10
        )


def ledger(sessions: sessionmaker[Session], machine_id: str) -> list[tuple[str, str, str]]:
    with sessions() as s:
        rows = s.scalars(
            select(models.Failure).where(models.Failure.machine_id == machine_id).order_by(models.Failure.id)
        )
        return [(r.failure_class, r.detector, (r.details or "").split(":")[0]) for r in rows]


def wait_for(check: Callable[[], bool], what: str, log: Callable[[], str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s\n{log()[-4000:]}"
        time.sleep(0.1)


def test_the_reaper_destroys_a_faulted_machine_and_refuses_on_the_ledger(
    pg_url: str, tmp_path: Path, sim: SimProvisioner, scheduler: ServiceProcess
) -> None:
    sessions = make_sessionmaker(make_engine(pg_url))
    now = datetime.now(UTC)

    def ours(**values: object) -> str:
        machine_id = add_machine(sessions, now, **values)
        instance = sim.create(machine_id)
        with sessions() as s, s.begin():
            s.get_one(models.Machine, machine_id).provider_instance_id = instance.provider_instance_id
        return machine_id

    broken = ours()
    warned = ours()
    box = add_machine(sessions, now, origin="REGISTERED", provider_instance_id=None)
    # A dispatch that raced the cordon: the finding stored, a live attempt on it.
    pinned = ours(cordoned=True, gpu_health="critical", gpu_findings=STORED_XID_79)
    add_attempt(sessions, now, pinned)
    heartbeat(scheduler, broken, XID_79)
    heartbeat(scheduler, warned, XID_13)
    heartbeat(scheduler, box, XID_79)

    reaper = start_service(
        "reaper",
        tmp_path / "reaper",
        {
            "GPUFLEET_DATABASE_URL": pg_url,
            "GPUFLEET_PROVISIONER_ADDRESS": sim.address,
            "GPUFLEET_INSTANCE_NAME": "reaper-under-test",
            "GPUFLEET_CLOCK": "real",
            "GPUFLEET_GPU_FAULT_EVERY_S": "0.5",
        },
    )
    try:

        def state(machine_id: str) -> str:
            with sessions() as s:
                return s.get_one(models.Machine, machine_id).state

        wait_for(lambda: state(broken) == "DESTROYED", "the faulted machine destroyed", reaper.log)
        # Three more passes of the net: the others are decided again, and kept.
        time.sleep(1.5)
        with reaper.channel() as channel:
            dogs = reaper_service_pb2_grpc.ReaperServiceStub(channel).ListWatchdogs(
                reaper_service_pb2.ListWatchdogsRequest(), timeout=5
            )
        [net] = [d for d in dogs.watchdogs if d.watchdog_id == "gpu_fault"]
    finally:
        reaper.stop(timeout=45)
    assert reaper.process.returncode == 0, reaper.log()

    assert sim.instance(broken) is None  # gone at the provider, not stopped
    assert ledger(sessions, broken) == [
        ("gpu_fault", "gpu_health", "cordoned; [xid 79] GPU 0"),
        ("gpu_fault_destroyed", "gpu_fault", "critical GPU finding (xid 79 on GPU 0)"),
    ]
    assert [c.op for c in sim.cloud.calls if c.machine_id == broken] == ["create", "destroy"]

    kept = sim.instance(warned)
    assert kept is not None and kept.status is InstanceStatus.RUNNING
    assert state(warned) == "READY" and ledger(sessions, warned) == []

    assert state(box) == "READY"
    assert ledger(sessions, box) == [
        ("gpu_fault", "gpu_health", "cordoned; [xid 79] GPU 0"),
        ("gpu_fault_destroy_refused", "gpu_fault", "NOT_OURS"),
    ]
    assert state(pinned) == "READY"
    assert ledger(sessions, pinned) == [("gpu_fault_destroy_refused", "gpu_fault", "WORK_PINNED")]
    assert [c.op for c in sim.cloud.calls if c.machine_id == pinned] == ["create"]

    assert net.runs >= 3
    assert dict(net.refusals)["NOT_OURS"] >= 3 and dict(net.refusals)["WORK_PINNED"] >= 3
    assert net.cadence.ToTimedelta().total_seconds() == 0.5
