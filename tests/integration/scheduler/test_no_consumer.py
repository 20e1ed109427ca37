"""A pool nothing can serve, against the real ProvisionerService (sim driver only) over
gRPC and PostgreSQL — the case the issue saw: one job for a pool whose only offering was
on a provider the provisioner does not run aborted the tick's creates, its machine row
stayed PROVISIONING against the fleet's ceiling, and the other pool never got its
second machine."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from gpufleet.common.catalog import Catalog, KindSpec, OfferingSpec, PlanSpec, PoolSpec, WorkspaceSpec
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.leadership import LeaderLease
from gpufleet.provisioner.drivers.sim import SimCloud, SimDriver
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.fleet import FleetTick
from gpufleet.scheduler.tick.served import ServedOfferings
from gpufleet.scheduler.watchdogs.no_consumer import NoConsumerDetector
from tests.support import tls
from tests.support.fleet_rows import add_job
from tests.support.sim_provisioner import serve_provisioner

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def offering(oid: str, provider: str) -> OfferingSpec:
    region = "sim-1" if provider == "SIM" else "us-east-1"
    return OfferingSpec(
        id=oid,
        provider=provider,
        region=region,
        zone=f"{region}a",
        instance_type="l4",
        slots=2,
        hourly_price_micros=800_000,
    )


CATALOGUE = Catalog(
    plans=[PlanSpec(id="studio", tier=1, max_gpu_jobs=20)],
    workspaces=[WorkspaceSpec(id="ws", plan="studio")],
    kinds=[KindSpec(id="short", slots=1, time_limit_s=600.0, runs_writer_code=True)],
    pools=[
        PoolSpec(id="sim-pool", slots_per_machine=2, max_machines=4, offerings=[offering("sim-l4", "SIM")]),
        PoolSpec(id="aws-pool", slots_per_machine=2, max_machines=4, offerings=[offering("aws-l4", "AWS")]),
    ],
)


class World:
    def __init__(self, db_url: str, provisioner_address: str) -> None:
        self.clock = ManualClock(T0)
        self.engine = make_engine(db_url)
        self.sessions = make_sessionmaker(self.engine)
        with self.sessions() as s, s.begin():
            sync_catalog(s, CATALOGUE)
        self.settings = Settings(
            database_url=db_url,
            provisioner_address=provisioner_address,
            max_running_machines=2,
            **tls.settings("scheduler"),
        )
        self.provisioner = ProvisionerClient(provisioner_address, tls.transport("scheduler"), timeout_s=10)
        self.lease = LeaderLease("scheduler", "test", self.clock, self.sessions, 3600)
        assert self.lease.try_acquire()
        self.served = ServedOfferings()

    def tick(self, served: ServedOfferings | None = None) -> FleetTick:
        return FleetTick(
            self.sessions, self.clock, self.lease, self.provisioner, self.settings, served=served
        )

    def jobs(self, pool: str, n: int) -> list[str]:
        now = self.clock.now()
        return [
            add_job(self.sessions, now, id=f"{pool}-{i}", workspace_id="ws", pool_id=pool, kind_id="short")
            for i in range(n)
        ]

    def machines(self) -> list[models.Machine]:
        with self.sessions() as s:
            return list(s.execute(select(models.Machine).order_by(models.Machine.requested_at)).scalars())

    def job(self, job_id: str) -> models.Job:
        with self.sessions() as s:
            return s.get_one(models.Job, job_id)


@pytest.fixture
def world(pg_url: str) -> Iterator[World]:
    cloud = SimCloud(ManualClock(T0))
    with serve_provisioner(SimDriver(cloud, "test"), CATALOGUE) as server:
        w = World(pg_url, f"127.0.0.1:{server.port}")
        yield w
        w.provisioner.close()
        w.engine.dispose()


def test_a_pool_only_an_unrun_provider_serves_takes_no_capacity_and_its_jobs_fail_saying_why(
    world: World,
) -> None:
    sim_jobs, aws_jobs = world.jobs("sim-pool", 4), world.jobs("aws-pool", 2)
    detector = NoConsumerDetector(world.sessions, world.lease, world.provisioner, world.served, 2)
    report = detector.run(world.clock.now())
    assert report.actions == {"failed": 2} and report.refusals["HAS_USABLE_OFFERING"] == 4
    for job_id in aws_jobs:
        job = world.job(job_id)
        assert job.state == "FAILED" and job.charge_micros == 0
        assert "aws-l4 is on provider AWS, which the provisioner does not run" in job.status_message
    # The tick, knowing what is served, creates both machines the sim pool needs.
    tick = world.tick(world.served)
    try:
        tick.run(world.clock.now())
        tick.settle()
    finally:
        tick.close()
    machines = world.machines()
    assert [(m.offering_id, m.state) for m in machines] == [("sim-l4", "BOOTING"), ("sim-l4", "BOOTING")]
    assert [world.job(j).state for j in sim_jobs] == ["QUEUED"] * 4  # waiting for their machines
    with world.sessions() as s:
        rows = s.execute(select(models.Failure.failure_class, models.Failure.job_id)).all()
    assert sorted(rows) == sorted(("no_consumer", j) for j in aws_jobs)


def test_a_create_the_provisioner_refuses_outright_ends_its_row_and_holds_no_capacity(world: World) -> None:
    world.jobs("aws-pool", 1)
    tick = world.tick()  # the served offerings not read yet: nothing is filtered
    try:
        tick.run(world.clock.now())
        tick.settle()
        [refused] = world.machines()
        assert (refused.offering_id, refused.state, refused.intent) == ("aws-l4", "DESTROYED", "DESTROYED")
        assert "provider_not_served" in refused.state_reason
        # Its provider and region are halted (an operator must configure them), with an
        # incident; the fleet's ceiling of 2 is not held by it: the sim pool gets both.
        with world.sessions() as s:
            [halt] = s.execute(select(models.Quarantine)).scalars()
            [incident] = s.execute(select(models.Incident)).scalars()
        assert (halt.kind, halt.provider, halt.region) == ("PROVIDER_REGION", "AWS", "us-east-1")
        assert incident.failure_class == "provider_not_served"
        world.jobs("sim-pool", 4)
        world.clock.advance(timedelta(seconds=5))
        tick.run(world.clock.now())
        tick.settle()
    finally:
        tick.close()
    live = [m for m in world.machines() if m.state != "DESTROYED"]
    assert [m.offering_id for m in live] == ["sim-l4", "sim-l4"]
    # And nothing can serve the AWS pool now: the detector fails its job, naming the halt.
    served = ServedOfferings()
    NoConsumerDetector(world.sessions, world.lease, world.provisioner, served, 2).run(world.clock.now())
    assert "aws-l4 is on provider AWS" in world.job("aws-pool-0").status_message


def test_nothing_fails_while_what_the_provisioner_serves_is_unknown(world: World) -> None:
    world.jobs("aws-pool", 1)
    down = ProvisionerClient("127.0.0.1:9", tls.transport("scheduler"), timeout_s=1)
    try:
        report = NoConsumerDetector(world.sessions, world.lease, down, ServedOfferings(), 2).run(
            world.clock.now()
        )
    finally:
        down.close()
    assert report.actions == {} and report.refusals["PROVIDERS_UNKNOWN"] == 1
    assert report.refusals["PROVISIONER_UNREACHABLE"] == 1
    assert world.job("aws-pool-0").state == "QUEUED"
