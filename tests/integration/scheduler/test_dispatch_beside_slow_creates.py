"""Dispatch that a slow cloud cannot starve.

A fleet scaling up on GCE waits 30-60 s for each insert; the jobs that already fit on the
machines it has must start meanwhile, and no healthy machine may be backed off for a wait
of the scheduler's own making. Real parts: PostgreSQL, the real ProvisionerService over
gRPC on loopback with creates held for 60 s (the sim cloud's driver), a real agent over
mutual TLS (the scripted agent), and the scheduler's own ``FleetTick`` with its default
call settings, on a manual clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
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
from tests.support import tls
from tests.support.fleet_rows import add_machine, sim_l4_offering
from tests.support.scripted_services import ScriptedAgent, serve_agent
from tests.support.sim_provisioner import SlowCreates, serve_provisioner

pytestmark = pytest.mark.postgres

POOL = "l4"
KIND = "short"
T0 = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
READY_MACHINES = 10  # x 2 slots: 20 jobs fit now
CREATES = 20


def catalogue() -> Catalog:
    return Catalog(
        plans=[PlanSpec(id="studio", tier=1, max_gpu_jobs=200)],
        workspaces=[WorkspaceSpec(id="ws", plan="studio")],
        kinds=[KindSpec(id=KIND, slots=1, time_limit_s=600.0)],
        pools=[
            PoolSpec(
                id=POOL,
                slots_per_machine=2,
                max_machines=READY_MACHINES + CREATES,
                offerings=[sim_l4_offering()],
            )
        ],
    )


class World:
    def __init__(self, url: str, stack: ExitStack, **settings: Any) -> None:
        self.clock = ManualClock(T0)
        engine = make_engine(url)
        stack.callback(engine.dispose)
        self.sessions: sessionmaker[Session] = make_sessionmaker(engine)
        with self.sessions() as s, s.begin():
            sync_catalog(s, catalogue())
        self.driver = SlowCreates(SimCloud(self.clock), "test")
        stack.callback(self.driver.release)
        server = stack.enter_context(serve_provisioner(self.driver, catalogue()))
        self.settings = Settings(
            database_url=url,
            provisioner_address=f"127.0.0.1:{server.port}",
            max_running_machines=READY_MACHINES + CREATES,
            **tls.settings("scheduler"),
            **settings,
        )
        provisioner = ProvisionerClient(
            self.settings.provisioner_address,
            tls.transport("scheduler"),
            timeout_s=self.settings.provider_call_timeout_s,
        )
        stack.callback(provisioner.close)
        lease = LeaderLease("scheduler", "a", self.clock, self.sessions, self.settings.lease_ttl_s)
        assert lease.try_acquire()
        self.tick = FleetTick(self.sessions, self.clock, lease, provisioner, self.settings)
        stack.callback(self.tick.close)
        self.stack = stack

    def agent(self) -> ScriptedAgent:
        return self.stack.enter_context(serve_agent())

    def machine(self, agent: ScriptedAgent, **values: Any) -> str:
        return add_machine(
            self.sessions,
            self.clock.now(),
            pool_id=POOL,
            offering_id="sim-l4",
            agent_address=agent.address,
            worker_report_at=self.clock.now(),
            **values,
        )

    def jobs(self, n: int, first: int = 0) -> list[str]:
        ids = [f"job-{i:03d}" for i in range(first, first + n)]
        with self.sessions() as s, s.begin():
            for i, job_id in enumerate(ids):
                s.add(
                    models.Job(
                        id=job_id,
                        request_id=job_id,
                        request_hash="h",
                        workspace_id="ws",
                        pool_id=POOL,
                        kind_id=KIND,
                        pipeline_version="2026.11.3",
                        tenant_values={},
                        state="QUEUED",
                        created_at=self.clock.now() - timedelta(seconds=1000 - first - i),
                        updated_at=self.clock.now(),
                    )
                )
        return ids

    def states(self, job_ids: list[str]) -> dict[str, str]:
        with self.sessions() as s:
            rows = s.execute(select(models.Job.id, models.Job.state).where(models.Job.id.in_(job_ids)))
            return {job_id: state for job_id, state in rows}

    def machines(self) -> list[models.Machine]:
        with self.sessions() as s:
            return list(s.execute(select(models.Machine)).scalars())


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def wait_for(condition: Any, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_jobs_that_fit_start_while_twenty_creates_of_60_s_are_in_flight(
    pg_url: str, stack: ExitStack
) -> None:
    world = World(pg_url, stack)  # the default call settings
    agent = world.agent()
    ready = {world.machine(agent) for _ in range(READY_MACHINES)}
    fits = world.jobs(2 * READY_MACHINES)
    waits = world.jobs(2 * CREATES, first=100)  # need twenty new machines
    world.driver.create_s = 60.0

    report = world.tick.run(world.clock.now())
    assert report.actions["create"] == CREATES and report.actions["assign"] == len(fits)
    # One dispatch later every job that fits runs — while every create still waits at the
    # cloud (a create takes 60 s; these bounds are a tenth of that).
    wait_for(lambda: set(world.states(fits).values()) == {"RUNNING"}, "the jobs that fit to run", 6.0)
    # The provider pool's workers are all at the cloud, the other creates queued behind them.
    at_cloud = min(CREATES, world.settings.provider_call_workers)
    wait_for(lambda: world.driver.waiting == at_cloud, "the creates at the cloud", 6.0)
    assert world.tick.provider_calls.pending() == CREATES
    with world.sessions() as s:
        attempts = s.execute(select(models.Attempt.id)).scalars().all()
    assert sorted(agent.started) == sorted(attempts) and len(attempts) == len(fits)
    assert set(world.states(waits).values()) == {"QUEUED"}

    # The clock passes the dispatch deadline while the creates still hang: nothing is taken
    # back and no machine backs off.
    world.clock.advance(timedelta(seconds=world.settings.dispatch_deadline_s + 5))
    for machine_id in ready:  # their workers keep reporting
        with world.sessions() as s, s.begin():
            s.get_one(models.Machine, machine_id).worker_report_at = world.clock.now()
    report = world.tick.run(world.clock.now())
    assert report.actions["dispatch_taken_back"] == 0
    assert set(world.states(fits).values()) == {"RUNNING"}
    backed_off = [m.id for m in world.machines() if m.dispatch_failures or m.dispatch_backoff_until]
    assert backed_off == []
    assert world.tick.provider_calls.pending() == CREATES


def test_a_start_job_queued_in_our_own_pool_past_the_deadline_backs_no_machine_off(
    pg_url: str, stack: ExitStack
) -> None:
    # One dispatch worker: a frozen agent's StartJob holds it, the next dispatch queues here.
    world = World(pg_url, stack, dispatch_workers=1)
    frozen, good = world.agent(), world.agent()
    frozen.hang()
    cheap = world.machine(frozen, slots=1, hourly_price_micros=500_000)  # chosen first
    dear = world.machine(good, slots=1, hourly_price_micros=900_000)
    first, second = world.jobs(2)

    assert world.tick.run(world.clock.now()).actions["assign"] == 2
    wait_for(lambda: frozen.start_calls == 1, "the frozen agent to be sent its StartJob", 5.0)
    assert good.start_calls == 0, "the second dispatch waits in our pool"

    world.clock.advance(timedelta(seconds=world.settings.dispatch_deadline_s + 1))
    report = world.tick.run(world.clock.now())
    # The frozen agent was sent StartJob and did not answer: taken back, it backs off.
    assert report.actions["dispatch_taken_back"] == 1
    assert report.actions["dispatch_taken_back_agent_timeout"] == 1
    assert report.refusals["dispatch_queued_here"] == 1
    by_id = {m.id: m for m in world.machines()}
    assert by_id[cheap].dispatch_failures == 1 and by_id[cheap].dispatch_backoff_until is not None
    # The one queued behind it in our own pool: still starting, its machine not blamed.
    assert world.states([first, second]) == {first: "QUEUED", second: "DISPATCHING"}
    assert (by_id[dear].dispatch_failures, by_id[dear].dispatch_backoff_until) == (0, None)

    frozen.release()  # the worker is free again: the queued StartJob goes out and starts
    wait_for(lambda: world.states([second])[second] == "RUNNING", "the queued job to start", 20.0)
    assert good.start_calls == 1
    assert {m.id: m for m in world.machines()}[dear].dispatch_failures == 0
