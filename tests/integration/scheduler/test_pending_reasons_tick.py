"""Why a job waits, end to end: what a backend reads from GetJob, ListJobs and WatchJob while
the real fleet tick decides.

Real parts: PostgreSQL, the scheduler's ``FleetTick`` on a manual clock, ``JobService`` and
``WorkspaceService`` on the scheduler's asyncio gRPC server over TLS (called as the
``backend``), the real ProvisionerService over gRPC with the sim cloud's driver (its create
held, as a busy cloud's is), and a scripted agent over gRPC that accepts StartJob.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import Catalog, KindSpec, PlanSpec, PoolSpec, WorkspaceSpec
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.grpcserver import ServiceBinding, create_aio_server
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.trust.identity import Role
from gpufleet.provisioner.drivers.sim import SimCloud
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.job_service import JobService
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.fleet import FleetTick
from gpufleet.scheduler.workspace_service import WorkspaceService
from gpufleet.v1 import (
    catalog_pb2,
    job_pb2,
    job_service_pb2,
    job_service_pb2_grpc,
    workspace_service_pb2,
    workspace_service_pb2_grpc,
)
from tests.support import tls
from tests.support.fleet_rows import add_machine, sim_l4_offering
from tests.support.scripted_services import ScriptedAgent, serve_agent
from tests.support.sim_provisioner import SlowCreates, serve_provisioner

T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
T = TypeVar("T")
QUEUED = job_pb2.JOB_STATE_QUEUED


def catalogue() -> Catalog:
    return Catalog(
        plans=[PlanSpec(id="studio", tier=1, max_gpu_jobs=4)],
        workspaces=[WorkspaceSpec(id="ws", plan="studio")],
        kinds=[KindSpec(id="clip", slots=1, time_limit_s=600.0)],
        pools=[PoolSpec(id="l4", slots_per_machine=2, max_machines=2, offerings=[sim_l4_offering()])],
    )


@dataclass
class Scheduler:
    clock: ManualClock
    sessions: sessionmaker[Session]
    driver: SlowCreates
    tick: FleetTick
    jobs: job_service_pb2_grpc.JobServiceStub
    workspaces: workspace_service_pb2_grpc.WorkspaceServiceStub
    stack: ExitStack

    def agent(self) -> ScriptedAgent:
        return self.stack.enter_context(serve_agent())

    def submit(self, request_id: str) -> str:
        job = job_pb2.Job(workspace="ws", pool="l4", kind="clip", pipeline_version="2026.12.0")
        answer = self.jobs.SubmitJob(
            job_service_pb2.SubmitJobRequest(request_id=request_id, job=job), timeout=5
        )
        return str(answer.job_id)

    def get(self, job_id: str) -> job_pb2.Job:
        return self.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job_id), timeout=5)

    def set_active(self, active: bool) -> None:
        self.workspaces.UpdateWorkspace(
            workspace_service_pb2.UpdateWorkspaceRequest(
                workspace=catalog_pb2.Workspace(workspace_id="ws", active=active), update_mask=["active"]
            ),
            timeout=5,
        )

    def run_tick(self, after_s: float = 0.0) -> dict[str, int]:
        self.clock.advance(timedelta(seconds=after_s))
        with self.sessions() as s, s.begin():  # the machines' workers report in
            s.execute(
                update(models.Machine)
                .where(models.Machine.state == "READY")
                .values(worker_report_at=self.clock.now())
            )
        report = self.tick.run(self.clock.now())
        return dict(report.actions)

    def waiting_events(self, job_id: str, n: int) -> list[job_pb2.JobEvent]:
        """The job's first ``n`` events, as a WatchJob stream gives them."""
        stream = self.jobs.WatchJob(job_service_pb2.WatchJobRequest(job_id=job_id), timeout=10)
        events = []
        for event in stream:
            events.append(event)
            if len(events) == n:
                stream.cancel()
                break
        return events


def wait_for(condition: Callable[[], T], what: str, timeout_s: float = 30.0) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _binding(add: Any, servicer: Any, module: Any, name: str) -> ServiceBinding:
    return ServiceBinding(add, servicer, module.DESCRIPTOR.services_by_name[name].full_name)


@pytest.fixture
def scheduler(pg_url: str) -> Iterator[Scheduler]:
    clock = ManualClock(T0)
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    with ExitStack() as stack:
        stack.callback(engine.dispose)
        with sessions() as s, s.begin():
            sync_catalog(s, catalogue())
        driver = SlowCreates(SimCloud(clock), "test")
        stack.callback(driver.release)
        provisioner_server = stack.enter_context(serve_provisioner(driver, catalogue()))
        settings = Settings(
            database_url=pg_url,
            provisioner_address=f"127.0.0.1:{provisioner_server.port}",
            max_running_machines=4,
            **tls.settings("scheduler"),
        )
        provisioner = ProvisionerClient(
            settings.provisioner_address,
            tls.transport("scheduler"),
            timeout_s=settings.provider_call_timeout_s,
        )
        stack.callback(provisioner.close)
        lease = LeaderLease("scheduler", "replica-a", clock, sessions, settings.lease_ttl_s)
        assert lease.try_acquire()
        tick = FleetTick(sessions, clock, lease, provisioner, settings)
        stack.callback(tick.close)
        jobs = JobService(sessions, clock, tls.transport("scheduler"))
        stack.callback(jobs.close)
        api = create_aio_server(
            "127.0.0.1:0",
            [
                _binding(
                    job_service_pb2_grpc.add_JobServiceServicer_to_server, jobs, job_service_pb2, "JobService"
                ),
                _binding(
                    workspace_service_pb2_grpc.add_WorkspaceServiceServicer_to_server,
                    WorkspaceService(sessions, clock),
                    workspace_service_pb2,
                    "WorkspaceService",
                ),
            ],
            max_workers=4,
            transport=tls.transport("scheduler"),
        )
        stack.callback(api.stop, 0)
        channel = tls.channel(f"127.0.0.1:{api.port}", Role.SCHEDULER, who=Role.BACKEND)
        stack.callback(channel.close)
        yield Scheduler(
            clock,
            sessions,
            driver,
            tick,
            job_service_pb2_grpc.JobServiceStub(channel),
            workspace_service_pb2_grpc.WorkspaceServiceStub(channel),
            stack,
        )


def test_a_paused_workspaces_job_says_so_and_once_resumed_starts_with_its_reason_cleared(
    scheduler: Scheduler,
) -> None:
    agent = scheduler.agent()
    add_machine(
        scheduler.sessions,
        scheduler.clock.now(),
        pool_id="l4",
        offering_id="sim-l4",
        agent_address=agent.address,
        worker_report_at=scheduler.clock.now(),
    )
    job_id = scheduler.submit("paused-1")
    fresh = scheduler.get(job_id)  # no tick has looked at it yet
    assert (fresh.pending_reason, fresh.pending_message) == (job_pb2.PENDING_REASON_UNSPECIFIED, "")

    scheduler.set_active(False)
    actions = scheduler.run_tick()
    assert actions.get("assign", 0) == 0 and actions["pending_reason_set"] == 1
    got = scheduler.get(job_id)
    assert got.state == QUEUED
    assert got.pending_reason == job_pb2.PENDING_REASON_WORKSPACE_PAUSED
    assert got.pending_message == "workspace ws is paused; it starts once it is resumed"
    assert not got.HasField("expected_ready_time")
    (listed,) = scheduler.jobs.ListJobs(job_service_pb2.ListJobsRequest(workspace="ws"), timeout=5).jobs
    assert (listed.pending_reason, listed.pending_message) == (got.pending_reason, got.pending_message)
    _, waiting = scheduler.waiting_events(job_id, 2)
    assert (waiting.state, waiting.message) == (QUEUED, "waiting: " + got.pending_message)
    assert waiting.job.pending_reason == job_pb2.PENDING_REASON_WORKSPACE_PAUSED
    # Still paused a tick later: nothing is written again.
    assert "pending_reason_set" not in scheduler.run_tick(5)

    scheduler.set_active(True)
    assert scheduler.run_tick(5)["assign"] == 1
    scheduler.tick.settle(30)
    started = wait_for(
        lambda: (j := scheduler.get(job_id)).state == job_pb2.JOB_STATE_RUNNING and j, "the start"
    )
    assert (started.pending_reason, started.pending_message) == (job_pb2.PENDING_REASON_UNSPECIFIED, "")
    assert not started.HasField("expected_ready_time")
    with scheduler.sessions() as s:
        row = s.execute(
            select(models.Job.pending_reason, models.Job.pending_message).where(models.Job.id == job_id)
        ).one()
    assert tuple(row) == (None, None)  # cleared in the row, not only hidden
    assert len(agent.started) == 1


def test_a_job_waiting_for_the_machine_created_for_it_says_when_it_is_expected(
    scheduler: Scheduler,
) -> None:
    agent = scheduler.agent()
    scheduler.driver.create_s = 60.0  # the cloud's insert is held until released
    job_id = scheduler.submit("capacity-1")
    assert scheduler.run_tick()["create"] == 1
    got = scheduler.get(job_id)
    expected = T0 + timedelta(seconds=scheduler.tick.policy.typical_boot_s)  # nothing seen boot yet
    assert got.pending_reason == job_pb2.PENDING_REASON_WAITING_FOR_CAPACITY
    assert got.expected_ready_time.ToDatetime(tzinfo=UTC) == expected
    when = f"{expected:%Y-%m-%d %H:%M:%S} UTC"
    assert (
        got.pending_message == f"a machine of pool l4 is on its way for it, expected to take work at {when}"
    )
    _, waiting = scheduler.waiting_events(job_id, 2)
    assert waiting.job.pending_reason == job_pb2.PENDING_REASON_WAITING_FOR_CAPACITY

    # Ticks while the create hangs: the same machine, the same estimate, nothing written.
    assert "pending_reason_set" not in scheduler.run_tick(5)
    scheduler.driver.release()
    scheduler.tick.settle(30)
    with scheduler.sessions() as s:
        (machine,) = s.execute(select(models.Machine)).scalars()
    assert machine.state == "BOOTING"
    assert "pending_reason_set" not in scheduler.run_tick(5)
    assert scheduler.get(job_id).expected_ready_time.ToDatetime(tzinfo=UTC) == expected

    # Its worker reports in at 100 s: the job is assigned there, and waits no more.
    scheduler.clock.advance(timedelta(seconds=90))
    with scheduler.sessions() as s, s.begin():
        s.execute(
            update(models.Machine)
            .where(models.Machine.id == machine.id)
            .values(state="READY", state_changed_at=scheduler.clock.now(), agent_address=agent.address)
        )
    assert scheduler.run_tick()["assign"] == 1
    scheduler.tick.settle(30)
    started = wait_for(
        lambda: (j := scheduler.get(job_id)).state == job_pb2.JOB_STATE_RUNNING and j, "the start"
    )
    assert started.pending_reason == job_pb2.PENDING_REASON_UNSPECIFIED
    assert not started.HasField("expected_ready_time")
    # The leader learned the offering's boot (requested at T0, ready at T0 + 100 s): the
    # next machine of it is expected that long after its request.
    assert scheduler.tick.boot_times.typical_s() == {"sim-l4": 100.0}
