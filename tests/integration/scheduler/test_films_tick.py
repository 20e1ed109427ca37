"""Films through the real fleet tick and PostgreSQL: a drain written as DRAINING with its
earmark, no short given the draining machine, the film started there once its jobs end
(the machine ready again, the earmark cleared), an earmark released at once when its film
is cancelled, and a machine started for a film held for it.

Real parts: PostgreSQL, the scheduler's ``FleetTick`` on a manual clock, scripted agents
over gRPC that accept StartJob. The provisioner is the sim cloud's, for the start case.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

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
from tests.support import tls
from tests.support.fleet_rows import add_machine, sim_l4_offering
from tests.support.scripted_services import ScriptedAgent, serve_agent
from tests.support.sim_provisioner import SlowCreates, serve_provisioner

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def catalogue() -> Catalog:
    return Catalog(
        plans=[PlanSpec(id="studio", tier=1, max_gpu_jobs=20)],
        workspaces=[WorkspaceSpec(id="ws", plan="studio")],
        kinds=[
            KindSpec(id="long", slots=1, time_limit_s=12_600, expected_duration_s=3 * 3600),
            KindSpec(id="quick", slots=1, time_limit_s=3600, expected_duration_s=600),
            KindSpec(id="film", slots=0, time_limit_s=9 * 3600, expected_duration_s=4 * 3600),
        ],
        pools=[
            PoolSpec(
                id="l4",
                slots_per_machine=2,
                max_machines=2,
                offerings=[sim_l4_offering()],
            )
        ],
    )


@dataclass
class Films:
    clock: ManualClock
    sessions: sessionmaker[Session]
    tick: FleetTick
    agent: ScriptedAgent

    def machine(self, **values: Any) -> str:
        row = {
            "pool_id": "l4",
            "offering_id": "sim-l4",
            "agent_address": self.agent.address,
            "worker_report_at": self.clock.now(),
        }
        return add_machine(self.sessions, self.clock.now(), **(row | values))

    def job(self, job_id: str, kind: str, state: str = "QUEUED") -> str:
        with self.sessions() as s, s.begin():
            s.add(
                models.Job(
                    id=job_id,
                    request_id=job_id,
                    request_hash="h",
                    workspace_id="ws",
                    pool_id="l4",
                    kind_id=kind,
                    pipeline_version="2026.11.3",
                    tenant_values={},
                    state=state,
                    created_at=self.clock.now(),
                    updated_at=self.clock.now(),
                )
            )
        return job_id

    def running(self, job_id: str, kind: str, machine_id: str, slot: int) -> str:
        self.job(job_id, kind, "RUNNING")
        with self.sessions() as s, s.begin():
            s.add(
                models.Attempt(
                    id=f"{job_id}-a1",
                    job_id=job_id,
                    machine_id=machine_id,
                    slot=slot,
                    slots=1,
                    state="RUNNING",
                    started_at=self.clock.now(),
                    lease_expires_at=self.clock.now() + timedelta(hours=1),
                )
            )
        return f"{job_id}-a1"

    def finish(self, job_id: str) -> None:
        now = self.clock.now()
        with self.sessions() as s, s.begin():
            s.execute(
                update(models.Attempt)
                .where(models.Attempt.job_id == job_id)
                .values(state="SUCCEEDED", ended_at=now, holds_slot=False)
            )
            s.execute(update(models.Job).where(models.Job.id == job_id).values(state="SUCCEEDED"))

    def step(self, seconds: float = 5.0) -> Any:
        self.clock.advance(timedelta(seconds=seconds))
        with self.sessions() as s, s.begin():
            s.execute(update(models.Machine).values(worker_report_at=self.clock.now()))
        report = self.tick.run(self.clock.now())
        self.tick.settle(10.0)
        return report

    def row(self, machine_id: str) -> models.Machine:
        with self.sessions() as s:
            return s.get_one(models.Machine, machine_id)

    def attempts(self, job_id: str) -> list[models.Attempt]:
        with self.sessions() as s:
            return list(s.execute(select(models.Attempt).where(models.Attempt.job_id == job_id)).scalars())


@pytest.fixture
def films(pg_url: str) -> Iterator[Films]:
    clock = ManualClock(T0)
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    with ExitStack() as stack:
        stack.callback(engine.dispose)
        with sessions() as s, s.begin():
            sync_catalog(s, catalogue())
        cloud = SimCloud(clock)
        driver = SlowCreates(cloud, "test")
        stack.callback(driver.release)
        server = stack.enter_context(serve_provisioner(driver, catalogue()))
        settings = Settings(
            database_url=pg_url,
            provisioner_address=f"127.0.0.1:{server.port}",
            max_running_machines=2,
            **tls.settings("scheduler"),
        )
        provisioner = ProvisionerClient(
            settings.provisioner_address, tls.transport("scheduler"), timeout_s=10.0
        )
        stack.callback(provisioner.close)
        lease = LeaderLease("scheduler", "films", clock, sessions, settings.lease_ttl_s)
        assert lease.try_acquire()
        tick = FleetTick(sessions, clock, lease, provisioner, settings)
        stack.callback(tick.close)
        yield Films(clock, sessions, tick, stack.enter_context(serve_agent()))


def two_full_machines(films: Films) -> tuple[str, str]:
    long_m, quick_m = films.machine(), films.machine()
    films.running("long-1", "long", long_m, 0)
    films.running("long-2", "long", long_m, 1)
    films.running("quick-1", "quick", quick_m, 0)
    films.running("quick-2", "quick", quick_m, 1)
    return long_m, quick_m


def test_the_film_drains_the_soonest_ending_machine_and_starts_there_once_it_is_free(films: Films) -> None:
    long_m, quick_m = two_full_machines(films)
    films.job("film", "film")
    report = films.step()
    assert report.actions["drain"] == 1
    drained = films.row(quick_m)
    assert (drained.state, drained.earmarked_for) == ("DRAINING", "film")
    assert drained.state_changed_by == "fleet_tick" and "its jobs end soonest" in drained.state_reason
    assert films.row(long_m).state == "READY"

    # A short that arrives after the film does not start on the draining machine, even
    # when one of its slots frees; nothing running there is cut off.
    films.job("late-short", "quick")
    films.finish("quick-1")
    films.step()
    assert films.attempts("late-short") == []
    assert {a.state for a in films.attempts("quick-2")} == {"RUNNING"}

    # Its last job ends: the film starts there, on every slot; the machine is ready again.
    films.finish("quick-2")
    report = films.step()
    (attempt,) = films.attempts("film")
    assert (attempt.machine_id, attempt.slot, attempt.slots) == (quick_m, 0, 2)
    after = films.row(quick_m)
    assert (after.state, after.earmarked_for) == ("READY", None)
    assert after.state_reason == "film film started here"
    assert films.attempts("late-short") == []


def test_a_cancelled_film_releases_its_drain_at_once(films: Films) -> None:
    _, quick_m = two_full_machines(films)
    films.job("film", "film")
    films.step()
    assert films.row(quick_m).state == "DRAINING"
    with films.sessions() as s, s.begin():
        s.execute(update(models.Job).where(models.Job.id == "film").values(state="CANCELLED"))
    films.job("short", "quick")
    films.finish("quick-1")
    report = films.step()
    assert report.actions["earmark_released"] == 1
    released = films.row(quick_m)
    assert (released.state, released.earmarked_for) == ("READY", None)
    assert "no longer waiting" in released.state_reason
    # The freed slot is ordinary capacity again: the short takes it in the next tick.
    films.step()
    assert [a.machine_id for a in films.attempts("short")] == [quick_m]


def test_a_machine_started_for_a_film_is_held_for_it(films: Films) -> None:
    busy = films.machine()
    films.running("long-1", "long", busy, 0)
    stopped = films.machine(state="STOPPED", intent="STOPPED", worker_report_at=None)
    films.job("film", "film")
    report = films.step()
    assert report.actions["start"] == 1
    row = films.row(stopped)
    assert (row.state, row.earmarked_for) == ("STARTING", "film")
    assert row.state_reason == "started for film film"
    assert row.earmarked_at == films.clock.now()
    # A short queued now does not count the film's machine as arriving for it, and takes
    # the free slot of the busy machine instead.
    films.job("short", "quick")
    films.step()
    assert [a.machine_id for a in films.attempts("short")] == [busy]
