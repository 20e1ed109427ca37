"""A scheduler's metered parts on real PostgreSQL, for the metrics tests: the real
``FleetTick`` on a manual clock, the real ``WorkerService`` and ``JobService`` called in
process, each recording into one ``MetricsProbe`` an operator's reading comes from, and a
scripted agent served over gRPC on loopback that accepts (or holds) StartJob.

The catalogue: a free plan (tier 0, one job at a time) and a studio plan (tier 1), a
workspace on each, a short kind, a capped kind (a 30 s limit) and a film, and one L4 pool
of two-slot sim machines (1 GPU, $0.80 an hour).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import Catalog, KindSpec, PlanSpec, PoolSpec, WorkspaceSpec
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import TickReport
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.job_service import JobService
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.fleet import FleetTick
from gpufleet.scheduler.worker_service import WorkerService
from gpufleet.v1 import job_pb2, job_service_pb2, worker_service_pb2
from tests.support import tls
from tests.support.fleet_rows import add_machine, sim_l4_offering
from tests.support.metrics import MetricsProbe
from tests.support.scripted_services import ScriptedAgent, serve_agent

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
# Nothing listens there: no test here creates a machine.
NOWHERE = "127.0.0.1:9"


def catalogue(warm_target: int = 0, max_machines: int = 4) -> Catalog:
    return Catalog(
        plans=[
            PlanSpec(id="free", tier=0, max_gpu_jobs=1),
            PlanSpec(id="studio", tier=1, max_gpu_jobs=20),
        ],
        workspaces=[WorkspaceSpec(id="ws-free", plan="free"), WorkspaceSpec(id="ws-studio", plan="studio")],
        kinds=[
            KindSpec(id="short", slots=1, time_limit_s=3600.0),
            KindSpec(id="capped", slots=1, time_limit_s=30.0),
            KindSpec(id="film", slots=0, time_limit_s=9 * 3600, expected_duration_s=4 * 3600),
        ],
        pools=[
            PoolSpec(
                id="l4",
                slots_per_machine=2,
                max_machines=max_machines,
                warm_target=warm_target,
                offerings=[sim_l4_offering()],
            )
        ],
    )


@dataclass
class MeteredFleet:
    clock: ManualClock
    sessions: sessionmaker[Session]
    settings: Settings
    probe: MetricsProbe
    agent: ScriptedAgent
    stack: ExitStack
    provisioner: ProvisionerClient
    ticks: dict[str, tuple[LeaderLease, FleetTick]] = field(default_factory=dict)

    # -- rows --------------------------------------------------------------------------
    def machine(self, **values: Any) -> str:
        row = {
            "pool_id": "l4",
            "offering_id": "sim-l4",
            "agent_address": self.agent.address,
            "worker_report_at": self.clock.now(),
        }
        return add_machine(self.sessions, self.clock.now(), **(row | values))

    def job(
        self,
        job_id: str,
        kind: str = "short",
        workspace: str = "ws-studio",
        waited_s: float = 0.0,
        **values: Any,
    ) -> str:
        created = self.clock.now() - timedelta(seconds=waited_s)
        row: dict[str, Any] = dict(
            id=job_id,
            request_id=job_id,
            request_hash="h",
            workspace_id=workspace,
            pool_id="l4",
            kind_id=kind,
            pipeline_version="v1",
            tenant_values={},
            state="QUEUED",
            created_at=created,
            updated_at=created,
        )
        with self.sessions() as s, s.begin():
            s.add(models.Job(**(row | values)))
        return job_id

    def running(
        self,
        job_id: str,
        machine_id: str,
        slot: int,
        kind: str = "short",
        started_s_ago: float = 0.0,
        **values: Any,
    ) -> str:
        """A job already running on ``slot`` of ``machine_id`` (its lease an hour long)."""
        self.job(job_id, kind, state="RUNNING", attempt_count=1, **values)
        with self.sessions() as s, s.begin():
            s.add(
                models.Attempt(
                    id=f"{job_id}-a1",
                    job_id=job_id,
                    machine_id=machine_id,
                    slot=slot,
                    slots=1,
                    state="RUNNING",
                    started_at=self.clock.now() - timedelta(seconds=started_s_ago),
                    lease_expires_at=self.clock.now() + timedelta(hours=1),
                )
            )
        return f"{job_id}-a1"

    def attempts(self, job_id: str) -> list[models.Attempt]:
        with self.sessions() as s:
            query = select(models.Attempt).where(models.Attempt.job_id == job_id)
            return list(s.execute(query.order_by(models.Attempt.started_at)).scalars())

    def job_state(self, job_id: str) -> str:
        with self.sessions() as s:
            return s.get_one(models.Job, job_id).state

    # -- the scheduler's parts ---------------------------------------------------------
    def leader(self, name: str = "replica-a") -> FleetTick:
        """This replica's tick (made once), its lease taken now."""
        if name not in self.ticks:
            lease = LeaderLease("scheduler", name, self.clock, self.sessions, self.settings.lease_ttl_s)
            tick = FleetTick(
                self.sessions,
                self.clock,
                lease,
                self.provisioner,
                self.settings,
                instruments=self.probe.instruments,
            )
            self.stack.callback(tick.close)
            self.ticks[name] = (lease, tick)
        lease, tick = self.ticks[name]
        assert lease.try_acquire(), f"{name} could not take the lease"
        return tick

    def tick(self, after_s: float = 0.0, replica: str = "replica-a", heartbeat: bool = True) -> TickReport:
        """Advance the clock, let the machines' workers report (``heartbeat``), run one tick
        and wait for its calls."""
        self.clock.advance(timedelta(seconds=after_s))
        if heartbeat:
            with self.sessions() as s, s.begin():
                s.execute(update(models.Machine).values(worker_report_at=self.clock.now()))
        tick = self.leader(replica)
        report = tick.run(self.clock.now())
        report.actions.update(tick.settle(30).actions)
        return report

    def workers(self) -> WorkerService:
        return WorkerService(self.sessions, self.clock, self.settings, self.probe.instruments)

    def jobs(self) -> JobService:
        jobs = JobService(self.sessions, self.clock, tls.transport("scheduler"), self.probe.instruments)
        self.stack.callback(jobs.close)
        return jobs

    def complete(self, attempt: models.Attempt, outcome: int, slot_seconds: float = 10.0) -> None:
        self.workers().ReportCompletion(
            worker_service_pb2.ReportCompletionRequest(
                machine_id=attempt.machine_id,
                attempt_id=attempt.id,
                outcome=outcome,
                exit_code=0 if outcome == job_pb2.ATTEMPT_STATE_SUCCEEDED else 1,
                slot_seconds=slot_seconds,
            ),
            None,  # type: ignore[arg-type]
        )

    def cancel(self, job_id: str) -> None:
        self.jobs().CancelJob(job_service_pb2.CancelJobRequest(job_id=job_id, reason="not needed"), None)  # type: ignore[arg-type]


@contextmanager
def metered_fleet(pg_url: str, catalog: Catalog | None = None, **settings: Any) -> Iterator[MeteredFleet]:
    clock = ManualClock(T0)
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    with ExitStack() as stack:
        stack.callback(engine.dispose)
        with sessions() as s, s.begin():
            sync_catalog(s, catalog or catalogue())
        probe = MetricsProbe()
        stack.callback(probe.close)
        config = Settings(
            database_url=pg_url,
            provisioner_address=NOWHERE,
            **(dict(max_running_machines=4) | settings),
            **tls.settings("scheduler"),
        )
        provisioner = ProvisionerClient(NOWHERE, tls.transport("scheduler"), timeout_s=5.0)
        stack.callback(provisioner.close)
        agent = stack.enter_context(serve_agent())
        yield MeteredFleet(clock, sessions, config, probe, agent, stack, provisioner)
