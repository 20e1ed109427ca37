"""The fleet tick's metrics after a real tick: PostgreSQL, real agents over gRPC (one that
starts jobs, one whose address answers nothing) and the scheduler's own ``FleetTick`` on a
manual clock, with instruments of the test's own to read back.

One tick assigns four jobs across two machines; the good agent starts two, the
unreachable one's two are taken back. The metrics say exactly that, and count the
machines the tick read by state, pool and provider."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import Catalog, KindSpec, PlanSpec, PoolSpec, WorkspaceSpec
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.metrics.catalog import (
    FLEET_MACHINES,
    JOBS_STARTED,
    SCHEDULER_ASSIGNMENTS,
    SCHEDULER_DISPATCH_FAILURES,
    SCHEDULER_TICK_PHASE_DURATION,
)
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.fleet import FleetTick
from tests.support import tls
from tests.support.fleet_rows import add_machine, sim_l4_offering
from tests.support.metrics import MetricsProbe
from tests.support.scripted_services import serve_agent

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
PHASES = {"snapshot", "connect", "decide", "limits", "films", "pools", "scale", "assign", "follow_up"}
# Nothing listens there: a StartJobs to it fails unreachable.
NOWHERE = "127.0.0.1:9"


def catalogue() -> Catalog:
    sim = sim_l4_offering()
    return Catalog(
        plans=[PlanSpec(id="studio", tier=1, max_gpu_jobs=20)],
        workspaces=[WorkspaceSpec(id="ws", plan="studio")],
        kinds=[KindSpec(id="short", slots=1, time_limit_s=600.0, runs_writer_code=True)],
        pools=[PoolSpec(id="l4", slots_per_machine=2, max_machines=4, offerings=[sim])],
    )


@pytest.fixture
def sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        sync_catalog(s, catalogue())
    yield sessions
    engine.dispose()


def add_jobs(sessions: sessionmaker[Session], n: int, now: datetime) -> None:
    with sessions() as s, s.begin():
        for i in range(n):
            s.add(
                models.Job(
                    id=f"job-{i}",
                    request_id=f"job-{i}",
                    request_hash="h",
                    workspace_id="ws",
                    pool_id="l4",
                    kind_id="short",
                    pipeline_version="v1",
                    tenant_values={},
                    state="QUEUED",
                    created_at=now - timedelta(seconds=100 - i),
                    updated_at=now,
                )
            )


def test_one_tick_is_measured_by_phase_and_counts_assignments_starts_failures_and_machines(
    sessions: sessionmaker[Session], pg_url: str
) -> None:
    clock = ManualClock(T0)
    # Two running machines are the limit: the stopped one is not started for this queue.
    settings = Settings(
        database_url=pg_url, provisioner_address=NOWHERE, max_running_machines=2, **tls.settings("scheduler")
    )
    probe = MetricsProbe()
    with serve_agent() as agent:
        machine = {"pool_id": "l4", "offering_id": "sim-l4", "worker_report_at": T0}
        add_machine(sessions, T0, agent_address=agent.address, **machine)
        add_machine(sessions, T0, agent_address=NOWHERE, **machine)
        add_machine(sessions, T0, state="STOPPED", intent="STOPPED", **machine)
        add_jobs(sessions, 4, T0)
        lease = LeaderLease("scheduler", "replica-a", clock, sessions, settings.lease_ttl_s)
        assert lease.try_acquire()
        provisioner = ProvisionerClient(NOWHERE, tls.transport("scheduler"), timeout_s=5.0)
        tick = FleetTick(sessions, clock, lease, provisioner, settings, instruments=probe.instruments)
        try:
            report = tick.run(clock.now())
            settled = tick.settle(60)
        finally:
            tick.close()
            provisioner.close()

    assert report.actions["assign"] == 4 and report.actions["create"] == 0
    assert settled.actions["dispatched"] == 2 and settled.actions["start_job_failed_agent_unreachable"] == 2
    phases = probe.series(SCHEDULER_TICK_PHASE_DURATION.name)
    assert phases == {(("phase", phase),): 1 for phase in PHASES}
    assert probe.series(SCHEDULER_ASSIGNMENTS.name) == {(("pool", "l4"),): 4}
    assert probe.series(JOBS_STARTED.name) == {(("kind", "short"),): 2}
    assert probe.series(SCHEDULER_DISPATCH_FAILURES.name) == {(("cause", "agent_unreachable"),): 2}
    assert probe.series(FLEET_MACHINES.name) == {}  # the tick closed: it reports no more
    probe.close()


def test_the_machines_gauge_reads_the_ticks_snapshot_until_it_goes_stale(
    sessions: sessionmaker[Session], pg_url: str
) -> None:
    clock = ManualClock(T0)
    settings = Settings(database_url=pg_url, provisioner_address=NOWHERE, **tls.settings("scheduler"))
    probe = MetricsProbe()
    machine = {"pool_id": "l4", "offering_id": "sim-l4", "worker_report_at": T0}
    for state, intent in (("READY", "RUNNING"), ("READY", "RUNNING"), ("STOPPED", "STOPPED")):
        add_machine(sessions, T0, state=state, intent=intent, **machine)
    add_machine(sessions, T0, state="DESTROYED", intent="DESTROYED", **machine)  # history: not counted
    lease = LeaderLease("scheduler", "replica-a", clock, sessions, settings.lease_ttl_s)
    assert lease.try_acquire()
    provisioner = ProvisionerClient(NOWHERE, tls.transport("scheduler"), timeout_s=5.0)
    tick = FleetTick(sessions, clock, lease, provisioner, settings, instruments=probe.instruments)
    try:
        tick.run(clock.now())
        machines = probe.series(FLEET_MACHINES.name)
        assert {k: n for k, n in machines.items() if n} == {
            (("pool", "l4"), ("provider", "SIM"), ("state", "READY")): 2,
            (("pool", "l4"), ("provider", "SIM"), ("state", "STOPPED")): 1,
        }
        assert len(machines) == 8  # every state but DESTROYED, for the one place (l4, SIM)
        clock.advance(timedelta(seconds=3 * settings.tick_s + 1))
        assert probe.series(FLEET_MACHINES.name) == {}
    finally:
        tick.close()
        provisioner.close()
        probe.close()
