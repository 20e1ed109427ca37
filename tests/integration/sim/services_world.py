"""The services driven through a simulator ``Script``: the same story the simulator tells,
told to the real control plane on PostgreSQL.

Real parts: the scheduler's ``FleetTick`` (its scale step creating machines through the
real ProvisionerService and its ``sim`` driver over gRPC, its dispatch calling the
machines' agents over gRPC) and ``WorkerService`` (over gRPC, each call as its machine);
the reaper's whole set of nets (``build_watchdogs``) and the sweeper's inventory reconcile
and orphan sweep, each under the real ``Ticker`` and leader lease; one manual clock.

Played here, as the script says (the simulator's truth of a machine): each machine's agent
(a scripted one, reachable ``agent_up_s`` after its instance runs, answering the idle
scanner with what it runs) and its worker (first report ``startup_s`` after that, then a
heartbeat every ``heartbeat_s`` listing the attempts it runs, each reported SUCCEEDED
``run_s`` after the agent took it, until the script's death of that worker). The clock moves
in steps of the fleet tick's cadence; within a step the world plays first, then the nets
(as the simulator orders one instant's events), then the fleet tick, and every call each
made is answered before the clock moves.

What it records is what the simulator's ``history`` records: each machine's and each
job's states with the step at which they were first seen.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace
from unittest import mock

import grpc
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool
from gpufleet.common.catalog import DEFAULT_CATALOG, Catalog, OfferingSpec, PoolSpec, WorkspaceSpec
from gpufleet.common.clients.agent import AgentClient
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import PeriodicTask, Ticker
from gpufleet.provisioner.drivers.base import InstanceStatus
from gpufleet.provisioner.drivers.sim import SimCloud
from gpufleet.reaper.settings import Settings as ReaperSettings
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.scheduler.tick import scale
from gpufleet.scheduler.tick.fleet import FleetTick
from gpufleet.scheduler.watchdogs import pool_idle
from gpufleet.sim.clock import EPOCH
from gpufleet.sim.profile import Script
from gpufleet.sim.world import PLANS
from gpufleet.sweeper.main import build_passes
from gpufleet.sweeper.settings import Settings as SweeperSettings
from gpufleet.v1 import (
    agent_service_pb2,
    job_pb2,
    worker_service_pb2,
)
from tests.support import tls
from tests.support.plane_parts import reaper_ticker, serve_workers
from tests.support.scripted_services import ScriptedAgent, agent_server
from tests.support.sim_provisioner import serve_sim_provisioner

History = list[tuple[float, str, str, str]]
# A version-4 UUID's fixed bits (version 4, RFC 4122 variant), around a counter.
_UUID4_BITS = (4 << 76) | (2 << 62)
_ORDINAL_BITS = (1 << 62) - 1

# A log of every write of a machine's state, for the test's eyes only (the services keep
# the last move on the row; a step of the clock can hold several).
MOVES_LOG = (
    "CREATE TABLE test_machine_moves (id bigserial PRIMARY KEY, machine_id text, state text, at timestamptz)",
    """CREATE FUNCTION test_log_machine_move() RETURNS trigger AS $$
    BEGIN
        IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state THEN
            INSERT INTO test_machine_moves (machine_id, state, at)
            VALUES (NEW.id, NEW.state, COALESCE(NEW.state_changed_at, NEW.requested_at));
        END IF;
        RETURN NEW;
    END $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER test_machine_moves AFTER INSERT OR UPDATE ON machines
    FOR EACH ROW EXECUTE FUNCTION test_log_machine_move()""",
)


class TimedAgent(ScriptedAgent):
    """A scripted agent that notes when (by the clock) it took each attempt."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.taken: dict[str, float] = {}
        self.startup_complete = True

    def StartJob(
        self, request: agent_service_pb2.AgentServiceStartJobRequest, context: grpc.ServicerContext
    ) -> agent_service_pb2.AgentServiceStartJobResponse:
        answer = super().StartJob(request, context)
        with self.lock:
            self.taken.setdefault(request.attempt_id, (self.clock.now() - EPOCH).total_seconds())
        return answer

    def Probe(
        self, request: agent_service_pb2.ProbeRequest, context: grpc.ServicerContext
    ) -> agent_service_pb2.ProbeResponse:
        if not self.reachable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "scripted: agent down")
        return agent_service_pb2.ProbeResponse(worker_alive=True, startup_complete=self.startup_complete)


@dataclass
class Box:
    """One machine's truth: its instance's current life and what its worker runs."""

    machine_id: str
    agent: TimedAgent
    ordinal: int
    life: int = 0
    running_since: float | None = None  # this life's instance RUNNING since (None: not running)
    # attempt id -> (taken at, run seconds, slots)
    attempts: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)


@dataclass
class Leaders:
    """What one generation of the control plane's processes runs (a restart starts anew)."""

    tick: FleetTick
    scheduler_lease: LeaderLease
    reaper: Ticker
    reaper_calls: CallPool
    sweeper: Ticker
    scheduler_watchdogs: Ticker


@dataclass
class ServicesWorld:
    script: Script
    clock: ManualClock
    sessions: sessionmaker[Session]
    cloud: SimCloud
    leaders: Leaders
    start_leaders: Callable[[int], Leaders]
    workers: tls.AsNamedMachine  # the WorkerService, called as each machine
    stack: ExitStack
    tick_s: float
    heartbeat_s: float
    dispatch_s: float
    boxes: dict[str, Box] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)  # by arrival: the services' job ids
    queued_at: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- the truth --------------------------------------------------------------------

    def agent_for(self, machine_id: str) -> str:
        """The sim cloud asks where a running instance's agent listens: the machine's own
        scripted agent, made the first time, serving with that machine's certificate."""
        with self._lock:
            box = self.boxes.get(machine_id)
            if box is None:
                agent = TimedAgent(self.clock)
                agent.reachable = False
                server = agent_server(agent, tls.transport(f"machine:{machine_id}"), max_workers=2)
                self.stack.callback(server.stop, 0)
                # The n-th machine the scale step made (its id carries n: see the uuid4 patch in
                # services_world()),
                # whichever of two creates in flight at once asks first.
                ordinal = int(uuid.UUID(machine_id)) & _ORDINAL_BITS
                box = self.boxes[machine_id] = Box(machine_id, agent, ordinal=ordinal)
            return box.agent.address

    def now_s(self) -> float:
        return (self.clock.now() - EPOCH).total_seconds()

    def _play(self, t: float) -> None:
        """Arrivals due, then each machine's agent and worker as the script has them."""
        for index, sj in enumerate(self.script.jobs):
            if index >= len(self.jobs) and sj.at <= t:
                self._submit(sj.workspace, sj.kind, sj.at)
        instances = {i.machine_id: i for i in self.cloud.all_instances()}
        for box in sorted(self.boxes.values(), key=lambda b: b.ordinal):
            inst = instances.get(box.machine_id)
            running = inst is not None and inst.status is InstanceStatus.RUNNING
            if running and box.running_since is None:
                box.life += 1
                box.running_since = self._launched(box.machine_id)
                box.attempts.clear()
            elif not running:
                box.running_since = None
                box.agent.reachable = False
                continue
            since = box.running_since
            assert since is not None
            agent_up = since + self.script.agent_up_s
            startup = agent_up + self.script.startup_s
            dies = self._fails_at(box, startup, self.script.worker_deaths)
            wedged_at = self._fails_at(box, startup, self.script.worker_wedges)
            dies = min(dies, wedged_at)
            first = box.life == 1
            stalled = first and box.ordinal in self.script.stalls
            dropped = first and any(
                startup + after <= t < startup + after + heal
                for ordinal, after, heal in self.script.path_drops
                if ordinal == box.ordinal
            )
            box.agent.reachable = t >= agent_up and not stalled and not dropped
            if first and any(
                o == box.ordinal and startup + after <= t for o, after in self.script.preemptions
            ):
                assert inst is not None
                self.cloud.preempt(inst.provider_instance_id)  # gone: the next step finds no instance
                box.running_since = None
                box.agent.reachable = False
                continue
            box.agent.startup_complete = not (first and box.ordinal in self.script.boot_hangs)
            if stalled or not box.agent.startup_complete:
                box.agent.quiet()
                continue
            with box.agent.lock:
                taken = dict(box.agent.taken)
                cancelled = list(box.agent.cancelled)
            for attempt_id, at in taken.items():
                if attempt_id not in box.attempts and attempt_id not in box.done and at >= since:
                    # The job runs from dispatch_s after the agent took it (the simulator's
                    # StartJob-to-running time).
                    box.attempts[attempt_id] = (at + self.dispatch_s, *self._run_of(attempt_id))
            for attempt_id in cancelled:  # the agent stopped it
                if box.attempts.pop(attempt_id, None) is not None:
                    box.done.add(attempt_id)
            reporting = startup <= t < dies
            if reporting:
                self._report(box, t, startup)
            # What the agent samples now: the GPU works while the worker runs jobs (a dead
            # worker's jobs are gone with it; a wedged worker holds the GPU busy).
            busy = (bool(box.attempts) and reporting) or t >= wedged_at
            box.agent.set_sample(
                gpu=90.0 if busy else 0.0, running=len(box.attempts) if reporting else 0, requests=0
            )

    @staticmethod
    def _fails_at(box: Box, startup: float, failures: tuple[tuple[int, float], ...]) -> float:
        """When this box's first-life worker fails as ``failures`` say (inf: never)."""
        return min(
            (startup + after for ordinal, after in failures if ordinal == box.ordinal and box.life == 1),
            default=float("inf"),
        )

    def _report(self, box: Box, t: float, startup: float) -> None:
        """The worker's reports due now: the jobs that ended, then its heartbeat."""
        for attempt_id, (at, run_s, slots) in sorted(box.attempts.items()):
            if at + run_s <= t:
                self.workers.ReportCompletion(
                    worker_service_pb2.ReportCompletionRequest(
                        machine_id=box.machine_id,
                        attempt_id=attempt_id,
                        outcome=job_pb2.ATTEMPT_STATE_SUCCEEDED,
                        slot_seconds=run_s * slots,
                    ),
                    timeout=10,
                )
                del box.attempts[attempt_id]
                box.done.add(attempt_id)
        if (t - startup) % self.heartbeat_s == 0:
            answer = self.workers.ReportHeartbeat(
                worker_service_pb2.ReportHeartbeatRequest(
                    machine_id=box.machine_id,
                    running=[worker_service_pb2.RunningAttempt(attempt_id=a) for a in sorted(box.attempts)],
                ),
                timeout=10,
            )
            for cancelled in answer.cancel_attempt_ids:
                box.attempts.pop(cancelled, None)
                box.done.add(cancelled)

    def _launched(self, machine_id: str) -> float:
        """When this life's instance began running: the create or start that made it (the
        sim cloud boots at once), in the script's seconds."""
        at = max(c.at for c in self.cloud.calls if c.machine_id == machine_id and c.op in ("create", "start"))
        return (at - EPOCH).total_seconds()

    def _run_of(self, attempt_id: str) -> tuple[float, int]:
        with self.sessions() as s:
            attempt = s.get_one(models.Attempt, attempt_id)
            index = self.jobs.index(attempt.job_id)
            return self.script.jobs[index].run_s, attempt.slots

    def _submit(self, workspace: str, kind: str, at: float) -> None:
        created = EPOCH + timedelta(seconds=at)
        job_id = f"00000000-0000-4000-8000-{len(self.jobs) + 1:012d}"
        with self.sessions() as s, s.begin():
            s.add(
                models.Job(
                    id=job_id,
                    request_id=job_id,
                    request_hash="h",
                    workspace_id=workspace,
                    pool_id=self.script.offering.pool,
                    kind_id=kind,
                    pipeline_version="v1",
                    tenant_values={},
                    state="QUEUED",
                    created_at=created,
                    updated_at=created,
                )
            )
        self.jobs.append(job_id)
        self.queued_at[job_id] = at

    # ---- time -------------------------------------------------------------------------

    def run(self, until_s: float) -> History:
        generation = 0
        while self.now_s() < until_s:
            self.clock.advance(timedelta(seconds=self.tick_s))
            t = self.now_s()
            self._play(t)  # the workers' calls reach the worker service whatever else runs
            restarts = self.script.restarts
            if any(at <= t < at + down_s for at, down_s in restarts):
                continue  # a deploy: the leaders' processes are gone
            ended = sum(1 for at, down_s in restarts if at + down_s <= t)
            if ended > generation:
                # A restart ended: new processes, new leases (the old ones ran out).
                generation = ended
                self.leaders = self.start_leaders(generation)
            leaders = self.leaders
            assert leaders.reaper.lease.try_acquire(), "the reaper could not take its lease"
            leaders.reaper.run_due()
            assert leaders.reaper_calls.wait_idle(30), "the reaper's provider calls did not finish"
            assert leaders.sweeper.lease.try_acquire(), "the sweeper could not take its lease"
            leaders.sweeper.run_due()
            assert leaders.scheduler_lease.try_acquire(), "the scheduler could not take its lease"
            leaders.scheduler_watchdogs.run_due()
            leaders.tick.run(self.clock.now())
            assert leaders.tick.provider_calls.wait_idle(30), "the tick's provider calls did not finish"
            assert leaders.tick.dispatch_calls.wait_idle(30), "the tick's dispatches did not finish"
        return self.history()

    def history(self) -> History:
        """Every machine's moves (as the test's trigger logged each write of a machine's
        state, with the clock reading the writer gave it) and every job's (its arrival,
        then its own events: what WatchJob streams)."""
        out: History = [(at, "job", job_id, "QUEUED") for job_id, at in self.queued_at.items()]
        with self.sessions() as s:
            moves = s.execute(text("SELECT machine_id, state, at FROM test_machine_moves ORDER BY id")).all()
            events = s.execute(
                select(models.JobEvent.job_id, models.JobEvent.state, models.JobEvent.at).order_by(
                    models.JobEvent.id
                )
            ).all()
        out += [((at - EPOCH).total_seconds(), "machine", mid, state) for mid, state, at in moves]
        out += [((at - EPOCH).total_seconds(), "job", job_id, state) for job_id, state, at in events]
        return sorted(out, key=lambda row: row[0])


def catalogue(script: Script, max_machines: int, warm_target: int = 0) -> Catalog:
    """The script's world as a catalogue: the simulator's plans (its caps for hundreds of
    machines), its workspaces, the catalogue's kinds, one pool of its one offering."""
    o = script.offering
    plans = sorted({plan for _, plan in script.workspaces})
    return Catalog(
        plans=[PLANS[p] for p in plans],
        workspaces=[WorkspaceSpec(id=ws, plan=plan) for ws, plan in script.workspaces],
        kinds=list(DEFAULT_CATALOG.kinds),
        pools=[
            PoolSpec(
                id=o.pool,
                slots_per_machine=2,
                max_machines=max_machines,
                warm_target=warm_target,
                offerings=[
                    OfferingSpec(
                        id=o.id,
                        provider="SIM",
                        region=o.region,
                        zone=o.zone,
                        instance_type=o.instance_type,
                        slots=2,
                        capacity_type="ON_DEMAND",
                        hourly_price_micros=o.hourly_price_micros,
                    )
                ],
            )
        ],
    )


@contextmanager
def services_world(
    pg_url: str,
    script: Script,
    *,
    machines: int,
    tick_s: float,
    heartbeat_s: float,
    dispatch_s: float,
    warm_target: int = 0,
) -> Iterator[ServicesWorld]:
    clock = ManualClock(EPOCH)
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    catalog = catalogue(script, machines, warm_target)
    deployment = tls.DEFAULT_DEPLOYMENT
    with ExitStack() as stack:
        stack.callback(engine.dispose)
        # Machine ids in order of creation, as the simulator's: the scale step breaks a tie
        # between two machines alike (which stopped one to start again) by id, and which
        # machine it picks carries that machine's past (its idle timers) into the story.
        ids = itertools.count(1)
        ordered = SimpleNamespace(uuid4=lambda: uuid.UUID(int=next(ids) | _UUID4_BITS))
        stack.enter_context(mock.patch.object(scale, "uuid", ordered))
        with sessions() as s, s.begin():
            sync_catalog(s, catalog)
            for statement in MOVES_LOG:
                s.execute(text(statement))
        sim = stack.enter_context(serve_sim_provisioner(clock, catalog, deployment))
        cloud, prov_address = sim.cloud, sim.address
        scheduler_settings = SchedulerSettings(
            database_url=pg_url,
            provisioner_address=prov_address,
            max_running_machines=machines,
            tick_s=tick_s,
            **tls.settings("scheduler"),
        )
        workers = serve_workers(stack, sessions, clock, scheduler_settings)

        def start_leaders(generation: int) -> Leaders:
            """The scheduler's fleet tick and pool idle release, the reaper's nets and the
            sweeper's passes, as one generation of processes starts them: new leases under
            new names, nothing of an earlier generation's memory. The first generation's
            passes are set on the simulator's grid (its first at one cadence from the
            start); a later one's run as a new process's do, at its start."""
            scheduler_provisioner = ProvisionerClient(
                prov_address, tls.transport("scheduler"), timeout_s=10.0
            )
            stack.callback(scheduler_provisioner.close)
            scheduler_lease = LeaderLease(
                "scheduler", f"scheduler-{generation}", clock, sessions, scheduler_settings.lease_ttl_s
            )
            transport = tls.transport("scheduler")
            tick = FleetTick(
                sessions,
                clock,
                scheduler_lease,
                scheduler_provisioner,
                scheduler_settings,
                agent_factory=lambda machine_id, address: AgentClient(machine_id, address, transport),
            )
            stack.callback(tick.close)
            # The reaper's nets.
            reaper_settings = ReaperSettings(
                database_url=pg_url, instance_name=f"reaper-{generation}", **tls.settings("reaper")
            )
            reaper, reaper_calls = reaper_ticker(stack, reaper_settings, sessions, clock, prov_address)
            # The sweeper's passes.
            sweeper_settings = SweeperSettings(
                database_url=pg_url, instance_name=f"sweeper-{generation}", **tls.settings("sweeper")
            )
            sweeper_provisioner = ProvisionerClient(prov_address, tls.transport("sweeper"), timeout_s=10.0)
            stack.callback(sweeper_provisioner.close)
            sweeper_lease = LeaderLease(
                "sweeper", f"sweeper-{generation}", clock, sessions, ttl_s=sweeper_settings.lease_ttl_s
            )
            passes = build_passes(sweeper_settings, sessions, sweeper_provisioner, sweeper_lease, clock)
            stack.callback(passes.orphans.close)
            sweeper = Ticker(
                "sweeper",
                clock,
                sessions,
                sweeper_lease,
                passes.tasks(sweeper_settings),
                renew_s=sweeper_settings.lease_renew_s,
            )
            # The scheduler's pool idle release (its other request watchdogs read what the
            # simulator does not model: requests, consumers, waits to report).
            scheduler_watchdogs = Ticker(
                "scheduler-watchdogs",
                clock,
                sessions,
                scheduler_lease,
                [
                    PeriodicTask(
                        pool_idle.NAME,
                        scheduler_settings.pool_idle_every_s,
                        pool_idle.PoolIdleRelease(sessions, scheduler_lease).run,
                    )
                ],
                renew_s=scheduler_settings.lease_renew_s,
            )
            if generation == 0:
                for ticker in (reaper, sweeper, scheduler_watchdogs):
                    for task in ticker.tasks:
                        task.next_at = EPOCH + timedelta(seconds=task.cadence_s)
            return Leaders(tick, scheduler_lease, reaper, reaper_calls, sweeper, scheduler_watchdogs)

        world = ServicesWorld(
            script=script,
            clock=clock,
            sessions=sessions,
            cloud=cloud,
            leaders=start_leaders(0),
            start_leaders=start_leaders,
            workers=workers,
            stack=stack,
            tick_s=tick_s,
            heartbeat_s=heartbeat_s,
            dispatch_s=dispatch_s,
        )
        cloud.agent_address = world.agent_for
        yield world
