"""A machine cordoned for a critical GPU fault is no capacity to the real fleet tick on
PostgreSQL (``metered_fleet``): the fault reported through the real WorkerService, the
machine then stopped as the money chain would stop it, and work or a warm target waiting —
the tick creates a replacement and never starts the faulted machine again; nor does a
start the tick recorded for it before the cordon committed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select, update

from gpufleet.common.db import models
from gpufleet.common.loops import TickReport
from gpufleet.scheduler.tick.model import StartMachine
from gpufleet.v1 import machine_pb2, worker_service_pb2
from tests.integration.scheduler.metered_fleet import MeteredFleet, catalogue, metered_fleet

XID_79 = machine_pb2.GpuHealth(
    state=machine_pb2.GPU_HEALTH_STATE_CRITICAL,
    findings=[
        machine_pb2.GpuFinding(
            kind="xid",
            severity=machine_pb2.GPU_FINDING_SEVERITY_CRITICAL,
            gpu_index=0,
            code=79,
            message="fell off the bus",
        )
    ],
)


@pytest.fixture
def fleet(pg_url: str) -> Iterator[MeteredFleet]:
    with metered_fleet(pg_url, catalogue(warm_target=1)) as fleet:
        yield fleet


def faulted(fleet: MeteredFleet, *, stopped: bool) -> str:
    """A machine whose worker reported Xid 79 (cordoned by the scheduler), then stopped by
    the money chain if ``stopped``."""
    machine_id = fleet.machine()
    fleet.workers().ReportHeartbeat(
        worker_service_pb2.ReportHeartbeatRequest(machine_id=machine_id, gpu_health=XID_79),
        None,  # type: ignore[arg-type]
    )
    with fleet.sessions() as s, s.begin():
        row = s.get_one(models.Machine, machine_id)
        assert (row.cordoned, row.gpu_health) == (True, "critical")
        if stopped:
            s.execute(
                update(models.Machine)
                .where(models.Machine.id == machine_id)
                .values(state="STOPPED", intent="STOPPED", agent_address=None)
            )
    return machine_id


def others(fleet: MeteredFleet, machine_id: str) -> list[str]:
    with fleet.sessions() as s:
        return list(
            s.execute(
                select(models.Machine.state)
                .where(models.Machine.id != machine_id)
                .order_by(models.Machine.id)
            ).scalars()
        )


def state(fleet: MeteredFleet, machine_id: str) -> str:
    with fleet.sessions() as s:
        return s.get_one(models.Machine, machine_id).state


def created_not_started(report: TickReport) -> bool:
    return report.actions["create"] == 1 and report.actions["start"] == 0


def test_work_waiting_creates_a_replacement_and_the_faulted_machine_stays_stopped(
    fleet: MeteredFleet,
) -> None:
    machine_id = faulted(fleet, stopped=True)
    fleet.job("short-1")
    report = fleet.tick(heartbeat=False)
    assert created_not_started(report), dict(report.actions)
    assert state(fleet, machine_id) == "STOPPED"
    assert len(others(fleet, machine_id)) == 1  # the replacement's row


def test_a_warm_target_is_not_held_by_a_faulted_running_machine(fleet: MeteredFleet) -> None:
    """No work at all: the pool's warm machine is faulted, so its replacement is asked for now,
    not after the money chain has stopped it."""
    machine_id = faulted(fleet, stopped=False)
    report = fleet.tick(heartbeat=False)
    assert created_not_started(report), dict(report.actions)
    assert state(fleet, machine_id) == "READY"
    with fleet.sessions() as s:
        assert not s.get_one(models.Machine, machine_id).warm_held


def test_a_start_recorded_after_the_cordon_committed_is_dropped(fleet: MeteredFleet) -> None:
    """The tick's snapshot was read before the cordon: the start's intent, recorded in the
    tick's own transaction, re-reads the locked row and drops it."""
    machine_id = faulted(fleet, stopped=True)
    tick = fleet.leader()
    report = TickReport()
    tick.scale.record([StartMachine(machine_id)], fleet.clock.now(), report)
    assert report.actions["start"] == 0
    assert state(fleet, machine_id) == "STOPPED"
