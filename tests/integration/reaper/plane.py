"""A running control plane for the reaper's scenarios, on a manual clock.

Real parts: the reaper's whole set of nets, built by ``main.build_watchdogs`` and run by
the real Ticker under the real leader lease; the real ProvisionerService with its sim
driver (``SimCloud``), over gRPC; the scheduler's real WorkerService, over gRPC, which is
what writes the worker channel (``worker_report_at``) and moves a machine BOOTING → READY;
one scripted agent per machine, over gRPC, answering Probe and SampleUtilization as the
test says; PostgreSQL.

Played by the test, each step before the reaper ticks: the workers' heartbeats (for the
machines whose worker is alive) and the sweeper's inventory reconcile (the provider
channel, ``provider_seen_at``, for intent-RUNNING machines the sim lists as running).

Every decision the nets make is captured from the reaper's decision log (net, machine,
action or gate), so a scenario can assert that no other net acted on its machine.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import grpc
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import (
    Failure,
    Incident,
    Job,
    JobKind,
    Machine,
    Offering,
    Plan,
    Pool,
    WatchdogStat,
    Workspace,
)
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import Ticker
from gpufleet.provisioner.drivers.base import InstanceStatus
from gpufleet.reaper.settings import Settings
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.v1 import (
    agent_service_pb2,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from tests.support import tls
from tests.support.plane_parts import reaper_ticker, serve_workers
from tests.support.scripted_services import ScriptedAgent, agent_server
from tests.support.sim_provisioner import SIM_OFFERING, SimProvisioner, serve_sim_provisioner

# What the idle scanner's bookkeeping looks like in the decision log: writing the probe
# channel, or seeing traffic with nothing armed. Not an action on the machine.
BOOKKEEPING = frozenset({"probe_ok", "probe_failed", "traffic"})
NETS = (
    "idle_scanner",
    "auto_stop",
    "auto_destroy",
    "provision_deadline",
    "boot_failure",
    "went_silent",
    "lost_detector",
    "stuck_transition",
    "gpu_fault",
)


class WorldAgent(ScriptedAgent):
    """A scripted agent whose Probe also says what the test wants about start-up."""

    def __init__(self) -> None:
        super().__init__()
        self.startup_complete = True
        self.startup_error = ""
        self.worker_alive = True
        self.probe_calls = 0

    def Probe(
        self, request: agent_service_pb2.ProbeRequest, context: grpc.ServicerContext
    ) -> agent_service_pb2.ProbeResponse:
        with self.lock:
            self.probe_calls += 1
            if not self.reachable:
                context.abort(grpc.StatusCode.UNAVAILABLE, "scripted: agent down")
            return agent_service_pb2.ProbeResponse(
                worker_alive=self.worker_alive,
                startup_complete=self.startup_complete,
                startup_error=self.startup_error,
            )


@dataclass(frozen=True)
class Decision:
    net: str
    machine_id: str
    action: str | None
    gate: str | None


class DecisionCapture(logging.Handler):
    """Collects every decision the nets log (the decision log's structured fields)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.decisions: list[Decision] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", None)
        if not isinstance(fields, dict) or "net" not in fields or "machine_id" not in fields:
            return
        with self._lock:
            self.decisions.append(
                Decision(fields["net"], fields["machine_id"], fields.get("action"), fields.get("gate"))
            )


@dataclass
class Plane:
    clock: ManualClock
    sessions: sessionmaker[Session]
    lease: LeaderLease
    ticker: Ticker
    sim: SimProvisioner
    worker_stub: worker_service_pb2_grpc.WorkerServiceStub
    capture: DecisionCapture
    stack: ExitStack
    # The nets' stops and destroys run here, after their pass has returned.
    calls: CallPool
    agents: dict[str, WorldAgent] = field(default_factory=dict)
    # Machines whose worker is alive and reports each step.
    reporting: set[str] = field(default_factory=set)

    # ---- building the world -------------------------------------------------------------

    def agent(self, machine_id: str) -> WorldAgent:
        """The agent of ``machine_id``, serving with that machine's own certificate."""
        agent = WorldAgent()
        server = agent_server(agent, tls.transport(f"machine:{machine_id}"), max_workers=2)
        self.stack.callback(server.stop, 0)
        return agent

    def machine(self, *, instance: bool = True, agent: bool = True, **values: Any) -> str:
        """A machine row of ours in the pool, with a sim instance and an agent unless told not.

        Defaults: READY since an hour, first observed an hour ago, nothing reported yet.
        """
        now = self.clock.now()
        mid = values.pop("id", None) or str(uuid.uuid4())
        row: dict[str, Any] = dict(
            id=mid,
            pool_id="pool",
            offering_id="sim-l4",
            provider="SIM",
            region=SIM_OFFERING.region,
            zone=SIM_OFFERING.zone,
            instance_type=SIM_OFFERING.instance_type,
            gpu_model="L4",
            gpu_count=1,
            slots=2,
            capacity_type="ON_DEMAND",
            hourly_price_micros=800_000,
            origin="PROVISIONED",
            managed=True,
            workload_class="REPORTING",
            state="READY",
            intent="RUNNING",
            lost=False,
            cordoned=False,
            requested_at=now - timedelta(hours=1, minutes=2),
            provision_deadline_at=now - timedelta(minutes=42),
            state_changed_at=now - timedelta(hours=1),
            first_observed_at=now - timedelta(hours=1),
            preemption_count=0,
            spot_seconds=0.0,
            start_failures=0,
        )
        if instance:
            row["provider_instance_id"] = self.sim.create(mid).provider_instance_id
        if agent:
            self.agents[mid] = self.agent(mid)
            row["agent_address"] = self.agents[mid].address
        row.update(values)
        with self.sessions() as s, s.begin():
            s.add(Machine(**row))
        return mid

    def queue_job(self) -> str:
        """A queued clip job in the pool: demand the scheduler's scale step will see."""
        now = self.clock.now()
        job_id = str(uuid.uuid4())
        with self.sessions() as s, s.begin():
            s.add(
                Job(
                    id=job_id,
                    request_id=job_id,
                    request_hash="h",
                    workspace_id="w",
                    pool_id="pool",
                    kind_id="clip",
                    pipeline_version="1",
                    state="QUEUED",
                    created_at=now,
                    updated_at=now,
                )
            )
        return job_id

    # ---- time -----------------------------------------------------------------------------

    def tick(self) -> None:
        """The world's step, then one pass of every net that is due, and the stops and
        destroys it sent answered and recorded."""
        self._play_world()
        self.lease.try_acquire()
        self.ticker.run_due()
        assert self.calls.wait_idle(30), f"{self.calls.pending()} provider calls still in flight"

    def step(self, seconds: float = 30.0) -> None:
        self.clock.advance(timedelta(seconds=seconds))
        self.tick()

    def run_until(
        self, done: Callable[[], bool], *, within_s: float, step_s: float = 30.0
    ) -> datetime | None:
        """Step until ``done()``; the clock reading when it first held, or None if it never did."""
        end = self.clock.now() + timedelta(seconds=within_s)
        while self.clock.now() < end:
            self.step(step_s)
            if done():
                return self.clock.now()
        return None

    def _play_world(self) -> None:
        now = self.clock.now()
        for mid in sorted(self.reporting):
            try:
                self.worker_stub.ReportHeartbeat(
                    worker_service_pb2.ReportHeartbeatRequest(machine_id=mid), timeout=5
                )
            except grpc.RpcError:
                self.reporting.discard(mid)  # destroyed: its worker is gone with it
        running = {i.machine_id for i in self.sim.cloud.all_instances() if i.status is InstanceStatus.RUNNING}
        if running:
            with self.sessions() as s, s.begin():
                s.execute(
                    update(Machine)
                    .where(
                        Machine.id.in_(sorted(running)),
                        Machine.intent == "RUNNING",
                        Machine.origin == "PROVISIONED",
                        Machine.state != "DESTROYED",
                    )
                    .values(provider_seen_at=now)
                )

    # ---- what a test reads ----------------------------------------------------------------

    def row(self, machine_id: str) -> Machine:
        with self.sessions() as s:
            row = s.get(Machine, machine_id)
            assert row is not None
            return row

    def ledger(self, machine_id: str) -> list[tuple[str, str, str]]:
        with self.sessions() as s:
            rows = s.execute(
                select(Failure).where(Failure.machine_id == machine_id).order_by(Failure.id)
            ).scalars()
            return [(f.failure_class, f.detector, f.outcome) for f in rows]

    def incidents(self, machine_id: str) -> list[str]:
        with self.sessions() as s:
            return list(
                s.execute(select(Incident.failure_class).where(Incident.machine_id == machine_id)).scalars()
            )

    def stats(self, name: str) -> WatchdogStat:
        with self.sessions() as s:
            row = s.get(WatchdogStat, name)
            assert row is not None
            return row

    def acted(self, machine_id: str) -> dict[str, set[str]]:
        """Every net that acted on ``machine_id`` (bookkeeping aside), with its actions."""
        out: dict[str, set[str]] = {}
        for d in self.capture.decisions:
            if d.machine_id == machine_id and d.action is not None and d.action not in BOOKKEEPING:
                out.setdefault(d.net, set()).add(d.action)
        return out

    def refused(self, machine_id: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for d in self.capture.decisions:
            if d.machine_id == machine_id and d.gate is not None:
                out.setdefault(d.net, set()).add(d.gate)
        return out

    def provider_ops(self, machine_id: str) -> list[str]:
        """Every call the sim cloud received for ``machine_id`` (the test's own creates aside)."""
        return [c.op for c in self.sim.cloud.calls if c.machine_id == machine_id and c.op != "create"]

    def instance_status(self, machine_id: str) -> InstanceStatus | None:
        found = self.sim.instance(machine_id)
        return found.status if found is not None else None

    def provider_stops(self, machine_id: str) -> None:
        """The instance stops at the provider, outside the platform (no call is recorded)."""
        inst = self.sim.instance(machine_id)
        assert inst is not None
        self.sim.cloud.preempt(inst.provider_instance_id, keep_disk=True)

    def provider_deletes(self, machine_id: str) -> None:
        """The instance disappears at the provider, outside the platform (no call recorded)."""
        inst = self.sim.instance(machine_id)
        assert inst is not None
        self.sim.cloud.preempt(inst.provider_instance_id)


def seed_catalog(sessions: sessionmaker[Session]) -> None:
    """The plan, workspace, pool, one sim offering and one job kind the scenarios use."""
    with sessions() as s, s.begin():
        s.add_all(
            [
                Plan(id="p", tier=0, weight=1.0, max_gpu_jobs=4, rate_micros=1_000_000),
                Pool(id="pool", gpu_model="L4", slots_per_machine=2, warm_target=0, max_machines=4),
                JobKind(id="clip", slots=1, time_limit_s=3600.0),
            ]
        )
        s.flush()
        s.add_all(
            [
                Workspace(id="w", plan_id="p", active=True),
                Offering(
                    id="sim-l4",
                    pool_id="pool",
                    rank=0,
                    provider="SIM",
                    region=SIM_OFFERING.region,
                    zone=SIM_OFFERING.zone,
                    instance_type=SIM_OFFERING.instance_type,
                    gpu_model="L4",
                    gpu_count=1,
                    slots=2,
                    capacity_type="ON_DEMAND",
                    hourly_price_micros=800_000,
                ),
            ]
        )


@contextmanager
def running_plane(db_url: str, **settings: Any) -> Iterator[Plane]:
    """The whole control plane of a scenario; ``settings`` override the reaper's."""
    clock = ManualClock()
    reaper_settings = Settings(
        database_url=db_url, instance_name="reaper-under-test", agent_timeout_s=2.0, **settings
    )
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    seed_catalog(sessions)
    capture = DecisionCapture()
    reaper_log = logging.getLogger("gpufleet.reaper")
    level = reaper_log.level
    with ExitStack() as stack:
        reaper_log.addHandler(capture)
        reaper_log.setLevel(logging.DEBUG)
        stack.callback(reaper_log.setLevel, level)
        stack.callback(reaper_log.removeHandler, capture)
        stack.callback(engine.dispose)
        sim = stack.enter_context(serve_sim_provisioner(clock))
        worker_stubs = serve_workers(stack, sessions, clock, SchedulerSettings(database_url=db_url))
        ticker, calls = reaper_ticker(stack, reaper_settings, sessions, clock, sim.address)
        lease = ticker.lease
        yield Plane(
            clock=clock,
            sessions=sessions,
            lease=lease,
            ticker=ticker,
            sim=sim,
            worker_stub=worker_stubs,  # type: ignore[arg-type]
            capture=capture,
            stack=stack,
            calls=calls,
        )
