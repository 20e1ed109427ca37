"""The fleet tick never waits on a network call: a create far slower than a tick, a leader
change in the middle of it, and an agent whose StartJob hangs.

Real parts: PostgreSQL, the real ProvisionerService over gRPC on loopback with the sim
cloud's driver (its create held, as a busy cloud's insert is), real agents over gRPC
(the scripted agent: it accepts StartJob, or holds it as a frozen agent does), and the
scheduler's own ``FleetTick`` on a manual clock. Each tick is run and returns; the test
then looks at what the tick did and at what its call pool is still doing.
"""

from __future__ import annotations

import time
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
from gpufleet.common.loops import TickReport
from gpufleet.provisioner.drivers.sim import SimCloud
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.fleet import FleetTick
from tests.support import tls
from tests.support.fleet_rows import add_machine, sim_l4_offering
from tests.support.scripted_services import ScriptedAgent, serve_agent
from tests.support.sim_provisioner import SlowCreates, serve_provisioner

POOL = "l4"
KIND = "short"
T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def catalogue() -> Catalog:
    return Catalog(
        plans=[PlanSpec(id="studio", tier=1, max_gpu_jobs=20)],
        workspaces=[WorkspaceSpec(id="ws", plan="studio")],
        kinds=[KindSpec(id=KIND, slots=1, time_limit_s=600.0, runs_writer_code=True)],
        pools=[
            PoolSpec(
                id=POOL,
                slots_per_machine=2,
                max_machines=6,
                offerings=[sim_l4_offering()],
            )
        ],
    )


@dataclass
class Fleet:
    clock: ManualClock
    sessions: sessionmaker[Session]
    cloud: SimCloud
    driver: SlowCreates
    provisioner: ProvisionerClient
    settings: Settings
    stack: ExitStack

    def leader(self, name: str) -> tuple[LeaderLease, FleetTick]:
        lease = LeaderLease("scheduler", name, self.clock, self.sessions, self.settings.lease_ttl_s)
        tick = FleetTick(self.sessions, self.clock, lease, self.provisioner, self.settings)
        self.stack.callback(tick.close)
        return lease, tick

    def agent(self) -> ScriptedAgent:
        return self.stack.enter_context(serve_agent())

    def machine(self, agent: ScriptedAgent, price: int = 800_000, **values: Any) -> str:
        row: dict[str, Any] = {
            "pool_id": POOL,
            "offering_id": "sim-l4",
            "agent_address": agent.address,
            "worker_report_at": self.clock.now(),
            "hourly_price_micros": price,
        }
        return add_machine(self.sessions, self.clock.now(), **(row | values))

    def job(self, n: int, state: str = "QUEUED") -> str:
        job_id = f"job-{n}"
        with self.sessions() as s, s.begin():
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
                    state=state,
                    created_at=self.clock.now() - timedelta(seconds=100 - n),
                    updated_at=self.clock.now(),
                )
            )
        return job_id

    def attempt(
        self, job_id: str, machine_id: str, slot: int, *, started_s_ago: float, lease_in_s: float
    ) -> str:
        attempt_id = f"{job_id}-a1"
        now = self.clock.now()
        with self.sessions() as s, s.begin():
            s.add(
                models.Attempt(
                    id=attempt_id,
                    job_id=job_id,
                    machine_id=machine_id,
                    slot=slot,
                    slots=1,
                    state="RUNNING",
                    started_at=now - timedelta(seconds=started_s_ago),
                    lease_expires_at=now + timedelta(seconds=lease_in_s),
                )
            )
        return attempt_id

    def row(self, model: Any, key: str) -> Any:
        with self.sessions() as s:
            return s.get_one(model, key)

    def attempts_of(self, job_id: str) -> list[models.Attempt]:
        with self.sessions() as s:
            query = select(models.Attempt).where(models.Attempt.job_id == job_id)
            return list(s.execute(query.order_by(models.Attempt.started_at)).scalars())

    def provisioning(self) -> list[models.Machine]:
        with self.sessions() as s:
            query = select(models.Machine).where(models.Machine.offering_id == "sim-l4")
            return [m for m in s.execute(query).scalars() if m.provider_instance_id is None or m.pending_call]


@pytest.fixture
def fleet(pg_url: str) -> Iterator[Fleet]:
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
            max_running_machines=4,
            dispatch_deadline_s=30.0,
            offering_quarantine_ttl_s=120.0,
            **tls.settings("scheduler"),
        )
        provisioner = ProvisionerClient(
            settings.provisioner_address,
            tls.transport("scheduler"),
            timeout_s=settings.provider_call_timeout_s,
        )
        stack.callback(provisioner.close)
        yield Fleet(clock, sessions, cloud, driver, provisioner, settings, stack)


def timed(tick: FleetTick, now: datetime) -> tuple[TickReport, float]:
    t0 = time.monotonic()
    report = tick.run(now)
    return report, time.monotonic() - t0


def wait_for(condition: Any, what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_create_slower_than_many_ticks_holds_up_nothing_and_a_leader_change_makes_one_instance(
    fleet: Fleet,
) -> None:
    good = fleet.agent()
    ready = fleet.machine(good)  # two free slots
    # Its worker stopped reporting two minutes ago: no new work goes there.
    busy = fleet.machine(good, worker_report_at=fleet.clock.now() - timedelta(minutes=2))
    # On it: one attempt whose lease has run out and one past its kind's 600 s limit.
    expiring = fleet.attempt(fleet.job(90, "RUNNING"), busy, 0, started_s_ago=30, lease_in_s=-1)
    overrunning = fleet.attempt(fleet.job(91, "RUNNING"), busy, 1, started_s_ago=700, lease_in_s=60)
    queued = [fleet.job(n) for n in range(3)]  # two fit on the ready machine; one needs a new one
    fleet.driver.create_s = 120.0  # the cloud's insert takes two minutes

    lease_a, tick_a = fleet.leader("replica-a")
    assert lease_a.try_acquire()
    report, took = timed(tick_a, fleet.clock.now())

    # The tick recorded the create and returned; everything else happened in this tick.
    assert took < 5.0, f"the tick waited on the create ({took:.1f}s)"
    assert report.actions["create"] == 1 and report.actions["assign"] == 2
    assert report.actions["lease_expired"] == 1 and report.actions["timed_out"] == 1
    assert fleet.row(models.Attempt, expiring).state == "LOST"
    assert fleet.row(models.Attempt, overrunning).state == "TIMED_OUT"
    (arriving,) = fleet.provisioning()
    assert (arriving.state, arriving.pending_call, arriving.provider_instance_id) == (
        "PROVISIONING",
        "create",
        None,
    )
    wait_for(lambda: fleet.driver.waiting == 1, "the create to reach the slow cloud")
    tick_a.dispatch_calls.wait_idle(5.0)  # the dispatches finish; the create does not
    assert tick_a.provider_calls.in_flight(f"create:{arriving.id}")
    on_ready = [a for j in queued[:2] for a in fleet.attempts_of(j)]
    assert {a.machine_id for a in on_ready} == {ready}
    assert sorted(good.started) == sorted(a.id for a in on_ready)

    # More ticks while the create hangs: nothing is created twice, new work still lands on
    # a machine that became ready meanwhile (one slot: for the oldest waiting job), and a
    # job that arrives now waits for the machine on its way.
    fleet.clock.advance(timedelta(seconds=5))
    late = fleet.job(50)
    more = fleet.machine(good, slots=1)
    report, took = timed(tick_a, fleet.clock.now())
    assert took < 5.0 and report.actions["create"] == 0 and report.actions["create_adopted"] == 0
    assert report.actions["assign"] == 1 and fleet.attempts_of(queued[2])[0].machine_id == more
    assert fleet.attempts_of(late) == []

    # The leader pauses; its lease runs out and replica b takes over mid-create.
    fleet.clock.advance(timedelta(seconds=fleet.settings.lease_ttl_s + 1))
    lease_b, tick_b = fleet.leader("replica-b")
    assert lease_b.try_acquire() and lease_b.epoch == 2
    report, took = timed(tick_b, fleet.clock.now())
    assert took < 5.0
    assert report.actions["create"] == 0 and report.actions["create_adopted"] == 1  # adopted by its key
    wait_for(lambda: fleet.driver.waiting == 2, "both leaders' creates at the cloud")

    # The cloud answers both: one instance, recorded once, never left PROVISIONING.
    fleet.driver.release()
    settled = tick_a.settle(30).actions + tick_b.settle(30).actions
    assert settled["created"] == 1 and settled["create_answer_superseded"] == 1
    instances = [i for i in fleet.cloud.all_instances() if i.machine_id == arriving.id]
    assert len(instances) == 1
    machine = fleet.row(models.Machine, arriving.id)
    assert (machine.state, machine.pending_call) == ("BOOTING", None)
    assert machine.provider_instance_id == instances[0].provider_instance_id
    assert machine.state_changed_by == "fleet_tick"

    # Its worker reports in: the waiting job runs there.
    with fleet.sessions() as s, s.begin():
        s.execute(
            update(models.Machine)
            .where(models.Machine.id == machine.id)
            .values(state="READY", worker_report_at=fleet.clock.now(), agent_address=good.address)
        )
    fleet.clock.advance(timedelta(seconds=5))
    assert tick_b.run(fleet.clock.now()).actions["assign"] == 1
    (attempt,) = fleet.attempts_of(late)
    assert attempt.machine_id == machine.id and attempt.epoch == 2
    tick_b.settle(30)
    assert fleet.row(models.Job, late).state == "RUNNING"


def test_an_agent_whose_start_job_hangs_is_taken_back_uncharged_and_the_job_runs_elsewhere(
    fleet: Fleet,
) -> None:
    frozen, good = fleet.agent(), fleet.agent()
    frozen.hang()
    cheap = fleet.machine(frozen, price=500_000)  # the cheapest: picked first
    dear = fleet.machine(good, price=900_000)
    job = fleet.job(1)
    lease, tick = fleet.leader("replica-a")
    assert lease.try_acquire()

    report, took = timed(tick, fleet.clock.now())
    assert took < 5.0 and report.actions["assign"] == 1
    (first,) = fleet.attempts_of(job)
    assert (first.machine_id, first.state) == (cheap, "STARTING")

    # Within the deadline nothing is taken back, however long the call hangs.
    fleet.clock.advance(timedelta(seconds=20))
    assert tick.run(fleet.clock.now()).actions["dispatch_taken_back"] == 0
    fleet.clock.advance(timedelta(seconds=11))  # 31 s: past the 30 s dispatch deadline
    report = tick.run(fleet.clock.now())
    assert report.actions["dispatch_taken_back"] == 1
    first = fleet.row(models.Attempt, first.id)
    assert (first.state, first.charged, first.charge_micros) == ("INFRA_ERROR", False, 0)
    assert "dispatch deadline" in first.status_message
    assert fleet.row(models.Job, job).state == "QUEUED"
    machine = fleet.row(models.Machine, cheap)
    assert machine.dispatch_failures == 1 and machine.dispatch_backoff_until > fleet.clock.now()

    # After the job's retry back-off it runs on the other machine: the frozen one backs off.
    fleet.clock.advance(timedelta(seconds=fleet.settings.retry_backoff_s + 1))
    assert tick.run(fleet.clock.now()).actions["assign"] == 1
    second = [a for a in fleet.attempts_of(job) if a.id != first.id]
    assert [a.machine_id for a in second] == [dear]
    wait_for(lambda: fleet.row(models.Job, job).state == "RUNNING", "the job to run on the good machine")
    assert good.started == [second[0].id]

    # The frozen agent thaws and starts the first attempt after all: it is told to stop it.
    frozen.release()
    tick.settle(30)
    wait_for(lambda: first.id in frozen.cancelled, "the taken-back attempt to be cancelled on its agent")
    assert fleet.row(models.Attempt, first.id).state == "INFRA_ERROR"


def test_a_stockout_quarantines_the_offering_for_the_configured_ttl(fleet: Fleet) -> None:
    fleet.cloud.set_stockout("sim-1a")
    fleet.job(1)
    lease, tick = fleet.leader("replica-a")
    assert lease.try_acquire()
    tick.run(fleet.clock.now())
    assert tick.settle(30).actions["create_failed_stockout"] == 1
    with fleet.sessions() as s:
        (quarantine,) = s.execute(select(models.Quarantine)).scalars()
    assert quarantine.offering_id == "sim-l4"
    assert quarantine.expires_at == fleet.clock.now() + timedelta(
        seconds=120
    )  # GPUFLEET_OFFERING_QUARANTINE_TTL_S


def test_a_cancelled_jobs_slot_is_free_only_once_the_machine_says_so(fleet: Fleet) -> None:
    from gpufleet.scheduler.job_service import JobService
    from gpufleet.scheduler.worker_service import WorkerService
    from gpufleet.v1 import job_service_pb2, worker_service_pb2

    agent = fleet.agent()
    machine_id = fleet.machine(agent, slots=1)
    first = fleet.job(1)
    lease, tick = fleet.leader("replica-a")
    assert lease.try_acquire()
    assert tick.run(fleet.clock.now()).actions["assign"] == 1
    tick.settle(30)
    (running,) = fleet.attempts_of(first)
    jobs, workers = (
        JobService(fleet.sessions, fleet.clock, tls.transport("scheduler")),
        WorkerService(fleet.sessions, fleet.clock, fleet.settings),
    )

    def heartbeat(*attempts: str) -> None:
        running_now = [worker_service_pb2.RunningAttempt(attempt_id=a, slot=0) for a in attempts]
        workers.ReportHeartbeat(
            worker_service_pb2.ReportHeartbeatRequest(machine_id=machine_id, running=running_now), None
        )

    heartbeat(running.id)
    jobs.CancelJob(job_service_pb2.CancelJobRequest(job_id=first, reason="changed my mind"), None)
    # CancelJob tells the agent from a thread of its own (over a TLS channel it may first open).
    wait_for(lambda: agent.cancelled, "the agent to be told")
    assert agent.cancelled == [running.id]
    second = fleet.job(2)

    # The machine has not said the process is gone: the slot is not given out.
    fleet.clock.advance(timedelta(seconds=5))
    assert tick.run(fleet.clock.now()).actions["assign"] == 0
    heartbeat(running.id)  # still winding down
    fleet.clock.advance(timedelta(seconds=5))
    assert tick.run(fleet.clock.now()).actions["assign"] == 0
    assert fleet.row(models.Job, second).state == "QUEUED"

    heartbeat()  # gone: the slot is free, and the next job goes there
    fleet.clock.advance(timedelta(seconds=5))
    assert tick.run(fleet.clock.now()).actions["assign"] == 1
    tick.settle(30)
    (attempt,) = fleet.attempts_of(second)
    assert (attempt.machine_id, attempt.slot) == (machine_id, 0)
    assert fleet.row(models.Job, second).state == "RUNNING"
    assert agent.started == [running.id, attempt.id]


def test_a_mass_lease_expiry_is_spread_over_ticks_so_no_pass_is_long(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufleet.scheduler.tick import limits

    monkeypatch.setattr(limits, "PER_TICK", 3)
    monkeypatch.setattr(limits, "BATCH", 2)
    agent = fleet.agent()
    gone = [
        fleet.attempt(
            fleet.job(n, "RUNNING"), fleet.machine(agent, slots=1), 0, started_s_ago=60, lease_in_s=-1
        )
        for n in range(5)
    ]
    lease, tick = fleet.leader("replica-a")
    assert lease.try_acquire()
    first = tick.run(fleet.clock.now())
    assert first.actions["lease_expired"] == 3 and first.refusals["lease_expired_next_tick"] == 2
    fleet.clock.advance(timedelta(seconds=5))
    second = tick.run(fleet.clock.now())
    assert second.actions["lease_expired"] == 2 and not second.refusals
    assert {fleet.row(models.Attempt, a).state for a in gone} == {"LOST"}
    tick.settle(30)
    assert sorted(agent.cancelled) == sorted(gone)  # each one told to stop on its agent


def test_a_lease_that_ran_out_on_a_machine_still_answering_spends_no_retry_of_the_jobs(fleet: Fleet) -> None:
    """A worker killed on a live machine: its agent still answers the reaper's probes long
    after the last renewal, so the loss is the platform's (a disruption, no retry of the
    job's spent); a machine that went dark — no probe answered since — might have been
    brought down by its job, so that loss spends the patient budget."""
    agent = fleet.agent()
    now = fleet.clock.now()
    renewed = now - timedelta(seconds=fleet.settings.attempt_lease_s + 1)  # lease ran out 1 s ago
    answering = fleet.machine(agent, slots=1, probe_ok_at=now - timedelta(seconds=5))
    dark = fleet.machine(agent, slots=1, probe_ok_at=renewed - timedelta(seconds=5))
    up, down = (
        fleet.attempt(fleet.job(n, "RUNNING"), m, 0, started_s_ago=600, lease_in_s=-1)
        for n, m in ((1, answering), (2, dark))
    )
    lease, tick = fleet.leader("replica-a")
    assert lease.try_acquire()
    assert tick.run(fleet.clock.now()).actions["lease_expired"] == 2
    tick.settle(30)
    for attempt_id, used in ((up, (0, 1)), (down, (1, 0))):
        attempt = fleet.row(models.Attempt, attempt_id)
        job = fleet.row(models.Job, attempt.job_id)
        assert (attempt.state, attempt.charged, job.state) == ("LOST", False, "QUEUED")
        assert (job.lost_retries_used, job.disruptions_used) == used, attempt_id
    assert "the machine still answered" in fleet.row(models.Job, "job-1").status_message
