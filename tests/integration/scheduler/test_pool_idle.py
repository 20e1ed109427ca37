"""A pool's warm capacity through the real fleet tick, the pool idle release watchdog and
PostgreSQL: the pool is topped up to its warm target and its machine pinned; idle for its
own idle time, the watchdog releases it (the pin cleared, a ledger row, the machine left
alone); work coming back holds the warm capacity again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import Catalog, KindSpec, PlanSpec, PoolSpec, WorkspaceSpec
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.leadership import LeaderLease
from gpufleet.provisioner.drivers.sim import SimCloud
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.fleet import FleetTick
from gpufleet.scheduler.watchdogs.pool_idle import PoolIdleRelease
from tests.support import tls
from tests.support.fleet_rows import sim_l4_offering
from tests.support.sim_provisioner import SlowCreates, serve_provisioner

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def catalogue() -> Catalog:
    return Catalog(
        plans=[PlanSpec(id="studio", tier=1, max_gpu_jobs=20)],
        workspaces=[WorkspaceSpec(id="ws", plan="studio")],
        kinds=[KindSpec(id="short", slots=1, time_limit_s=3600)],
        pools=[
            PoolSpec(
                id="l4",
                slots_per_machine=2,
                max_machines=2,
                warm_target=1,
                idle_release_after_s=600,
                offerings=[sim_l4_offering()],
            )
        ],
    )


@pytest.fixture
def plane(pg_url: str) -> Iterator[tuple[ManualClock, sessionmaker[Session], FleetTick, PoolIdleRelease]]:
    clock = ManualClock(T0)
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    with ExitStack() as stack:
        stack.callback(engine.dispose)
        with sessions() as s, s.begin():
            sync_catalog(s, catalogue())
        driver = SlowCreates(SimCloud(clock), "test")
        stack.callback(driver.release)
        server = stack.enter_context(serve_provisioner(driver, catalogue()))
        settings = Settings(
            database_url=pg_url, provisioner_address=f"127.0.0.1:{server.port}", **tls.settings("scheduler")
        )
        provisioner = ProvisionerClient(
            settings.provisioner_address, tls.transport("scheduler"), timeout_s=10.0
        )
        stack.callback(provisioner.close)
        lease = LeaderLease("scheduler", "warm", clock, sessions, settings.lease_ttl_s)
        assert lease.try_acquire()
        tick = FleetTick(sessions, clock, lease, provisioner, settings)
        stack.callback(tick.close)
        yield clock, sessions, tick, PoolIdleRelease(sessions, lease)


def test_warm_capacity_is_kept_while_the_pool_is_active_and_released_after_its_idle_time(
    plane: tuple[ManualClock, sessionmaker[Session], FleetTick, PoolIdleRelease],
) -> None:
    clock, sessions, tick, release = plane

    def pool() -> models.Pool:
        with sessions() as s:
            return s.get_one(models.Pool, "l4")

    def machines() -> list[models.Machine]:
        with sessions() as s:
            return list(s.execute(select(models.Machine)).scalars())

    # No work at all: the pool is topped up to its warm target, and its idle clock starts.
    report = tick.run(clock.now())
    tick.settle()
    assert report.actions["create"] == 1 and report.actions["pool_idle"] == 1
    assert pool().idle_since == T0
    (warm,) = machines()
    with sessions() as s, s.begin():  # its worker reports in
        s.execute(
            update(models.Machine).values(
                state="READY", worker_report_at=clock.now(), first_observed_at=clock.now()
            )
        )
    clock.advance(timedelta(seconds=5))
    tick.run(clock.now())
    assert [m.warm_held for m in machines()] == [True]

    # Idle, but not yet for its idle time (one second short): kept.
    clock.advance(timedelta(seconds=594))
    early = release.run(clock.now())
    assert early.refusals == {"NOT_IDLE_LONG_ENOUGH": 1} and early.actions == {}
    clock.advance(timedelta(seconds=1))
    done = release.run(clock.now())
    assert done.actions == {"released": 1}
    assert pool().warm_released is True
    (after,) = machines()
    assert (after.id, after.warm_held, after.state) == (warm.id, False, "READY"), "never touches the machine"
    with sessions() as s:
        (row,) = s.execute(
            select(models.Failure).where(models.Failure.failure_class == "pool_idle_release")
        ).scalars()
    assert "pool l4 had no work for 10 min" in row.details and warm.id in row.details
    # Released: the tick neither pins it again nor tops the pool up.
    clock.advance(timedelta(seconds=5))
    tick.run(clock.now())
    assert [m.warm_held for m in machines()] == [False]
    assert release.run(clock.now()).refusals == {"ALREADY_RELEASED": 1}

    # Work comes back: the clock stops and the warm capacity is held again.
    with sessions() as s, s.begin():
        s.add(
            models.Job(
                id="j1",
                request_id="j1",
                request_hash="h",
                workspace_id="ws",
                pool_id="l4",
                kind_id="short",
                pipeline_version="1",
                tenant_values={},
                state="QUEUED",
                created_at=clock.now(),
                updated_at=clock.now(),
            )
        )
        s.execute(update(models.Machine).values(worker_report_at=clock.now()))
    report = tick.run(clock.now())
    assert report.actions["pool_busy"] == 1
    assert (pool().idle_since, pool().warm_released) == (None, False)
    assert [m.warm_held for m in machines()] == [True]
    assert release.run(clock.now()).refusals == {"HAS_WORK": 1}
