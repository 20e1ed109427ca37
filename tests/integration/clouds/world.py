"""One control plane over two clouds, in-process, for the cross-cloud scenarios.

:func:`build_world` wires the real pieces together the way their ``main`` modules do:

- the **provisioner**: ``ProvisionerService`` with the ``gcp`` driver (on the GCE fake) and
  the ``aws`` driver (on moto, fault hooks on its clients), each wrapped as
  ``build_drivers`` wraps them, served over real gRPC on 127.0.0.1 port 0;
- the **scheduler**'s ``FleetTick`` (a ``LeaderLease`` that has acquired, the catalogue
  synced with ``sync_catalog``) and its ``JobService``;
- the **sweeper** as ``gpufleet.sweeper.main.build`` builds it (inventory reconcile and
  orphan sweep through a real ``ProvisionerClient``);
- the **reaper**'s ``ReaperService`` (ClearQuarantine) and its stuck-transition net;
- an **agent** that accepts every StartJob (no machine really boots here).

Everything shares one manual clock, started an hour behind real time (the clouds stamp
launch times from the wall clock) and moved only by the scenario, and one fresh
PostgreSQL database. The scenarios call each pass directly, so an exception in one fails
the test instead of being logged and counted by a Ticker.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import Catalog, KindSpec, OfferingSpec, PlanSpec, PoolSpec, WorkspaceSpec
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.convert import offering_to_proto
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.grpcserver import ServiceBinding, ServiceServer, create_aio_server, create_server
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import TickReport
from gpufleet.common.trust.identity import Role
from gpufleet.provisioner.drivers.base import Driver, Provider
from gpufleet.provisioner.drivers.instrumented import InstrumentedDriver
from gpufleet.provisioner.service import ProvisionerService
from gpufleet.reaper.service import ReaperService
from gpufleet.reaper.stuck_transition import StuckPolicy, StuckTransition
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.job_service import JobService
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.scheduler.tick.fleet import FleetTick
from gpufleet.sweeper.main import Sweeper, build
from gpufleet.sweeper.settings import Settings as SweeperSettings
from gpufleet.v1 import (
    agent_service_pb2,
    agent_service_pb2_grpc,
    job_pb2,
    job_service_pb2,
    job_service_pb2_grpc,
    provisioner_service_pb2,
    provisioner_service_pb2_grpc,
    reaper_service_pb2,
    reaper_service_pb2_grpc,
)
from tests.integration.clouds.clouds import Cloud
from tests.support import tls
from tests.support.fleet_rows import add_machine

DEPLOYMENT = "clouds-test"
FOREIGN_DEPLOYMENT = "someone-else"
POOL = "l4"
WORKSPACE = "studio"
KIND = "clip"

# The pool's offerings for a scenario about cloud X, with Y the other cloud; by expected
# cost (a spot offering's price carries the scheduler's prior pre-emption rate, 5 %/h):
# X zone a (spot, 315k) < X zone b (on-demand, 700k) < Y zone a (on-demand, 900k).
SPOT_PRICE = 300_000
SECOND_PRICE = 700_000
OTHER_CLOUD_PRICE = 900_000


def offering_id(cloud: Cloud, zone_index: int) -> str:
    return f"{cloud.name}-{cloud.zones[zone_index]}"


def catalogue(primary: Cloud, other: Cloud) -> Catalog:
    def offering(cloud: Cloud, zone_index: int, capacity: str, price: int) -> OfferingSpec:
        return OfferingSpec(
            id=offering_id(cloud, zone_index),
            provider=cloud.provider.value,  # type: ignore[arg-type]
            region=cloud.region,
            zone=cloud.zones[zone_index],
            instance_type=cloud.instance_type,
            gpu_model="L4",
            gpu_count=1,
            slots=1,
            capacity_type=capacity,  # type: ignore[arg-type]
            hourly_price_micros=price,
        )

    return Catalog(
        plans=[PlanSpec(id="studio-plan", tier=1, max_gpu_jobs=8)],
        workspaces=[WorkspaceSpec(id=WORKSPACE, plan="studio-plan")],
        kinds=[KindSpec(id=KIND, slots=1, time_limit_s=3600.0, runs_writer_code=False)],
        pools=[
            PoolSpec(
                id=POOL,
                slots_per_machine=1,
                max_machines=6,
                offerings=[
                    offering(primary, 0, "SPOT", SPOT_PRICE),
                    offering(primary, 1, "ON_DEMAND", SECOND_PRICE),
                    offering(other, 0, "ON_DEMAND", OTHER_CLOUD_PRICE),
                ],
            )
        ],
    )


class StartingAgent(agent_service_pb2_grpc.AgentServiceServicer):  # type: ignore[misc]
    """Every machine's agent, as far as the scheduler can tell: it accepts each StartJob."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[agent_service_pb2.AgentServiceStartJobRequest] = []
        self.server: ServiceServer | None = None

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    def StartJob(
        self, request: agent_service_pb2.AgentServiceStartJobRequest, context: grpc.ServicerContext
    ) -> agent_service_pb2.AgentServiceStartJobResponse:
        with self.lock:
            again = any(r.attempt_id == request.attempt_id for r in self.started)
            if not again:
                self.started.append(request)
        return agent_service_pb2.AgentServiceStartJobResponse(already_running=again)

    def CancelJob(
        self, request: agent_service_pb2.AgentServiceCancelJobRequest, context: grpc.ServicerContext
    ) -> agent_service_pb2.AgentServiceCancelJobResponse:
        return agent_service_pb2.AgentServiceCancelJobResponse(was_running=False)


@dataclass
class World:
    """The control plane and both clouds; ``cloud`` is the one the scenario is about."""

    cloud: Cloud
    other: Cloud
    clock: ManualClock
    sessions: sessionmaker[Session]
    provisioner: ProvisionerClient
    scheduler_lease: LeaderLease
    fleet_tick: FleetTick
    sweeper: Sweeper
    reaper_lease: LeaderLease
    stuck_transition: StuckTransition
    agent: StartingAgent
    jobs: job_service_pb2_grpc.JobServiceStub
    reaper: reaper_service_pb2_grpc.ReaperServiceStub

    # ---- time and the passes ----------------------------------------------------------

    def advance(self, seconds: float) -> datetime:
        return self.clock.advance(timedelta(seconds=seconds))

    def advance_to(self, at: datetime) -> datetime:
        return self.clock.advance(at - self.clock.now())

    def tick(self) -> TickReport:
        """One fleet tick of the scheduler's leader."""
        assert self.scheduler_lease.try_acquire()
        report = self.fleet_tick.run(self.clock.now())
        # The tick hands its provider calls and dispatches to its pool and returns; the
        # scenario waits for them, and counts what they did with the tick that asked.
        report.actions.update(self.fleet_tick.settle().actions)
        return report

    def _sweeper_pass(self, name: str) -> TickReport:
        assert self.sweeper.lease.try_acquire()
        (task,) = [t for t in self.sweeper.ticker.tasks if t.name == name]
        return task.run(self.clock.now())

    def reconcile(self) -> TickReport:
        """One inventory reconcile, as the sweeper's leader runs it (fenced, recorded)."""
        return self._sweeper_pass("inventory_reconcile")

    def orphan_sweep(self) -> TickReport:
        """One orphan sweep, as the sweeper's leader runs it (fenced, recorded)."""
        return self._sweeper_pass("orphan_sweep")

    def reap_stuck(self) -> TickReport:
        assert self.reaper_lease.try_acquire()
        return self.stuck_transition.run(self.clock.now())

    # ---- what a user or an operator does ----------------------------------------------

    def submit(self, request_id: str) -> str:
        job = job_pb2.Job(workspace=WORKSPACE, pool=POOL, kind=KIND, pipeline_version="2026.11.3")
        answer = self.jobs.SubmitJob(
            job_service_pb2.SubmitJobRequest(request_id=request_id, job=job), timeout=5
        )
        return str(answer.job_id)

    def clear_quarantine(self, quarantine_id: int) -> None:
        self.reaper.ClearQuarantine(
            reaper_service_pb2.ClearQuarantineRequest(quarantine_id=quarantine_id, request_id="clear-1"),
            timeout=5,
        )

    def machine_came_up(self, machine_id: str) -> None:
        """The machine booted and its worker reported: READY, fresh, its agent reachable."""
        now = self.clock.now()
        with self.sessions() as s, s.begin():
            s.execute(
                update(models.Machine)
                .where(models.Machine.id == machine_id)
                .values(
                    state="READY",
                    state_changed_at=now,
                    worker_report_at=now,
                    probe_ok_at=now,
                    agent_address=self.agent.address,
                )
            )

    def stopped_machine(self, offering: str) -> str:
        """A machine of ``offering`` made and later stopped through the provisioner (as the
        scale step and the money chain would have), recorded STOPPED; returns its id."""
        machine_id = str(uuid.uuid4())
        with self.sessions() as s:
            row = s.get_one(models.Offering, offering)
            offering_msg = offering_to_proto(row)
            columns = {
                name: getattr(row, name)
                for name in (
                    "provider",
                    "region",
                    "zone",
                    "instance_type",
                    "gpu_model",
                    "gpu_count",
                    "slots",
                    "capacity_type",
                    "hourly_price_micros",
                )
            }
        made = self.provisioner.create(machine_id, offering_msg, request_id=f"{machine_id}:create")
        self.provisioner.stop(
            machine_id, offering_msg, made.provider_instance_id, request_id=f"{machine_id}:stop"
        )
        now = self.clock.now()
        add_machine(
            self.sessions,
            now,
            id=machine_id,
            pool_id=POOL,
            offering_id=offering,
            provider_instance_id=made.provider_instance_id,
            state="STOPPED",
            intent="STOPPED",
            requested_at=now - timedelta(hours=1),
            state_changed_at=now - timedelta(minutes=30),
            first_observed_at=now - timedelta(hours=1),
            **columns,
        )
        return machine_id

    # ---- reading the store ------------------------------------------------------------

    def _rows(self, model: Any, *where: Any, order: Any = None) -> list[Any]:
        with self.sessions() as s:
            query = select(model).where(*where).order_by(order if order is not None else model.id)
            return list(s.execute(query).scalars())

    def machines(self) -> list[models.Machine]:
        return self._rows(models.Machine, order=models.Machine.requested_at)

    def machine(self, machine_id: str) -> models.Machine:
        with self.sessions() as s:
            return s.get_one(models.Machine, machine_id)

    def job(self, job_id: str) -> models.Job:
        with self.sessions() as s:
            return s.get_one(models.Job, job_id)

    def attempts(self, job_id: str) -> list[models.Attempt]:
        return self._rows(models.Attempt, models.Attempt.job_id == job_id, order=models.Attempt.started_at)

    def failures(self, failure_class: str | None = None) -> list[models.Failure]:
        where = [] if failure_class is None else [models.Failure.failure_class == failure_class]
        return self._rows(models.Failure, *where)

    def incidents(self, failure_class: str | None = None) -> list[models.Incident]:
        where = [] if failure_class is None else [models.Incident.failure_class == failure_class]
        return self._rows(models.Incident, *where)

    def quarantines(self) -> list[models.Quarantine]:
        return self._rows(models.Quarantine)

    def orphans(self) -> dict[str, models.Orphan]:
        """Orphan rows by the provider instance id."""
        return {o.provider_instance_id: o for o in self._rows(models.Orphan)}

    def launch_time(self, provider_instance_id: str) -> datetime:
        """The launch time the provisioner reports for one of our instances (what the
        orphan sweep counts from)."""
        listed, down = self.provisioner.list_all()
        assert not down
        (inst,) = [i for i in listed if i.provider_instance_id == provider_instance_id]
        return inst.launch_time.ToDatetime(tzinfo=UTC)


def _binding(add: Any, servicer: Any, module: Any, name: str) -> ServiceBinding:
    return ServiceBinding(add, servicer, module.DESCRIPTOR.services_by_name[name].full_name)


@contextmanager
def build_world(pg_url: str, cloud: Cloud, other: Cloud) -> Iterator[World]:
    # The clouds stamp launch times from the wall clock; the platform's clock starts an
    # hour behind it, so a scenario can place its sweeps before or after any launch.
    clock = ManualClock(datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1))
    catalog = catalogue(cloud, other)
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    with ExitStack() as stack:
        stack.callback(engine.dispose)

        drivers: dict[Provider, Driver] = {c.provider: c.driver(DEPLOYMENT, clock) for c in (cloud, other)}
        prov_server = create_server(
            "127.0.0.1:0",
            [
                _binding(
                    provisioner_service_pb2_grpc.add_ProvisionerServiceServicer_to_server,
                    ProvisionerService({p: InstrumentedDriver(d) for p, d in drivers.items()}, catalog),
                    provisioner_service_pb2,
                    "ProvisionerService",
                )
            ],
            max_workers=8,
            transport=tls.transport("provisioner", DEPLOYMENT),
        )
        stack.callback(prov_server.stop, 0)
        prov_address = f"127.0.0.1:{prov_server.port}"

        agent = StartingAgent()
        agent.server = create_server(
            "127.0.0.1:0",
            [
                _binding(
                    agent_service_pb2_grpc.add_AgentServiceServicer_to_server,
                    agent,
                    agent_service_pb2,
                    "AgentService",
                )
            ],
            max_workers=4,
            # It answers for each machine the clouds start (their addresses all lead here).
            transport=tls.stand_in_agent_transport(DEPLOYMENT),
        )
        stack.callback(agent.server.stop, 0)

        # The scheduler, as gpufleet.scheduler.main wires it.
        settings = SchedulerSettings(
            database_url=pg_url,
            provisioner_address=prov_address,
            instance_name="scheduler-1",
            **tls.settings("scheduler", DEPLOYMENT),
        )
        with sessions() as session, session.begin():
            sync_catalog(session, catalog)
        provisioner = ProvisionerClient(
            settings.provisioner_address,
            tls.transport("scheduler", DEPLOYMENT),
            timeout_s=max(30.0, settings.rpc_timeout_s),
        )
        stack.callback(provisioner.close)
        scheduler_lease = LeaderLease(
            "scheduler", settings.instance_name, clock, sessions, settings.lease_ttl_s
        )
        assert scheduler_lease.try_acquire()
        fleet_tick = FleetTick(sessions, clock, scheduler_lease, provisioner, settings)
        stack.callback(fleet_tick.close)

        # The sweeper, as gpufleet.sweeper.main.build wires it (its own provisioner client).
        sweeper_client = ProvisionerClient(prov_address, tls.transport("sweeper", DEPLOYMENT), timeout_s=30.0)
        stack.callback(sweeper_client.close)
        sweeper = build(
            SweeperSettings(
                database_url=pg_url,
                listen_address="127.0.0.1:0",
                instance_name="sweeper-1",
                **tls.settings("sweeper", DEPLOYMENT),
            ),
            clock=clock,
            provider=sweeper_client,
        )
        stack.callback(sweeper.close, 0)

        # The operator-facing services over gRPC: JobService and ReaperService, on the
        # asyncio server the scheduler serves JobService on (SubmitJob runs on its loop).
        jobs = JobService(sessions, clock, tls.transport("scheduler", DEPLOYMENT))
        stack.callback(jobs.close)
        api = create_aio_server(
            "127.0.0.1:0",
            [
                _binding(
                    job_service_pb2_grpc.add_JobServiceServicer_to_server,
                    jobs,
                    job_service_pb2,
                    "JobService",
                ),
                _binding(
                    reaper_service_pb2_grpc.add_ReaperServiceServicer_to_server,
                    ReaperService(sessions, clock),
                    reaper_service_pb2,
                    "ReaperService",
                ),
            ],
            max_workers=4,
            transport=tls.transport("scheduler", DEPLOYMENT),
        )
        stack.callback(api.stop, 0)
        channel = tls.channel(f"127.0.0.1:{api.port}", Role.SCHEDULER, deployment=DEPLOYMENT)
        stack.callback(channel.close)

        reaper_lease = LeaderLease("reaper", "reaper-1", clock, sessions, 15.0)
        stuck = StuckTransition(sessions, reaper_lease, clock, provisioner, StuckPolicy())

        yield World(
            cloud=cloud,
            other=other,
            clock=clock,
            sessions=sessions,
            provisioner=provisioner,
            scheduler_lease=scheduler_lease,
            fleet_tick=fleet_tick,
            sweeper=sweeper,
            reaper_lease=reaper_lease,
            stuck_transition=stuck,
            agent=agent,
            jobs=job_service_pb2_grpc.JobServiceStub(channel),
            reaper=reaper_service_pb2_grpc.ReaperServiceStub(channel),
        )
