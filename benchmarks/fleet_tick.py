"""The fleet tick at fleet scale: a burst tick, steady ticks, and ticks while creates hang.

Run it as ``.venv/bin/python benchmarks/fleet_tick.py --queued 10000 --machines 2000 --json``
(not a test: it prints figures). It starts its own throwaway PostgreSQL and, for each
size, a fresh migrated database with the catalogue synced the way the scheduler syncs it
(500 workspaces over 4 plans, one pool), ``--machines`` READY machines of 4 slots each
with a quarter of the slots busy, and ``--queued`` queued jobs. The scheduler's real
``FleetTick`` runs against it with the real ``ProvisionerService`` (its ``sim`` driver,
over gRPC on loopback) and one real agent server on loopback that answers StartJob at
once; every machine's agent address points at it.

Figures:

- **burst tick**: the first tick, which assigns every free slot; ``assignments_per_s`` is
  the assignments committed over that tick's wall time (snapshot, decide and the one
  transaction; the StartJob calls run afterwards in the call pool and are timed apart as
  ``dispatch_drain_s``). The baseline is the same writes as bare SQL (psycopg, one
  transaction, ``executemany``) measured in the same run.
- **steady ticks**: ticks with nothing left to assign (``tick_p50_s``, ``tick_p95_s``).
- **creates pending**: the ceiling is raised by 20 and the provider's create is made to
  take ``--create-s`` seconds (60); ``tick_while_creates_pending_s`` is the slowest of
  the tick that records those 20 creates and the ticks that follow while they are in
  flight.
- how the tick grows from 1k/500 to the requested size.

Anchors to quote beside the figures: Slurm sustains about 500 jobs/s; kube-scheduler about
700 pods/s at 5k nodes.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import multiprocessing
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
import psycopg
from sqlalchemy import Engine, event, text

from gpufleet.common.catalog import Catalog, KindSpec, OfferingSpec, PlanSpec, PoolSpec, WorkspaceSpec
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.migrate import upgrade
from gpufleet.common.grpcserver import ServiceBinding, ServiceServer, create_server
from gpufleet.common.leadership import LeaderLease
from gpufleet.provisioner.drivers.sim import SimCloud
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.fleet import FleetTick
from gpufleet.v1 import (
    agent_service_pb2,
    agent_service_pb2_grpc,
)
from tests.support import tls
from tests.support.postgres import PostgresServer, start_postgres
from tests.support.sim_provisioner import SlowCreates, serve_provisioner

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
SLOTS = 4
POOL = "l4x4"
PLANS = [("free", 0, 1.0, 8), ("creator", 1, 1.0, 16), ("studio", 2, 2.0, 32), ("enterprise", 3, 4.0, 64)]


def catalogue(workspaces: int, max_machines: int) -> Catalog:
    return Catalog(
        plans=[PlanSpec(id=p, tier=t, weight=w, max_gpu_jobs=n) for p, t, w, n in PLANS],
        workspaces=[WorkspaceSpec(id=f"ws{i:04d}", plan=PLANS[i % len(PLANS)][0]) for i in range(workspaces)],
        kinds=[KindSpec(id="short_episode", slots=1, time_limit_s=7200.0)],
        pools=[
            PoolSpec(
                id=POOL,
                slots_per_machine=SLOTS,
                max_machines=max_machines,
                offerings=[
                    OfferingSpec(
                        id="sim-l4x4",
                        provider="SIM",
                        region="sim-1",
                        zone="sim-1a",
                        instance_type="sim.l4x4",
                        slots=SLOTS,
                        hourly_price_micros=2_800_000,
                    )
                ],
            )
        ],
    )


# ---- the world: an agent that answers at once, the real provisioner with a slow create ---


class PromptAgent(agent_service_pb2_grpc.AgentServiceServicer):  # type: ignore[misc]
    """Answers StartJob at once. It runs in its own process, as a machine's agent does, so
    the scheduler's figures are not its own CPU shared with the agent's. ``broken``: it
    refuses every StartJob (the self-checks must then fail the run)."""

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken

    def StartJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        if self.broken:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "bench: this agent refuses every job")
        if len(request.tokens) != 2:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bench: StartJob came without its tokens")
        return agent_service_pb2.AgentServiceStartJobResponse(already_running=False)

    def StartJobs(self, request: Any, context: grpc.ServicerContext) -> Any:
        results = []
        for job in request.jobs:
            if self.broken:
                code, message = grpc.StatusCode.FAILED_PRECONDITION, "bench: this agent refuses every job"
            elif len(job.tokens) != 2:
                code, message = grpc.StatusCode.INVALID_ARGUMENT, "bench: StartJob came without its tokens"
            else:
                code, message = grpc.StatusCode.OK, ""
            answer = agent_service_pb2.StartJobResult(
                attempt_id=job.attempt_id, code=code.value[0], message=message
            )
            results.append(answer)
        return agent_service_pb2.StartJobsResponse(results=results)

    def CancelJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return agent_service_pb2.AgentServiceCancelJobResponse(was_running=False)


def _agent_process(ports: Any, stop: Any, broken: bool) -> None:
    # One agent answers for every machine of the benchmark, as itself for each: it serves
    # the tests' stand-in machine certificate (any machine id), which the scheduler checks
    # like a real machine's. (Serving the scheduler's certificate failed every handshake.)
    server = _serve(
        agent_service_pb2_grpc.add_AgentServiceServicer_to_server,
        PromptAgent(broken),
        agent_service_pb2,
        "AgentService",
        16,
        tls.stand_in_agent_transport(),
    )
    ports.put(server.port)
    stop.wait()
    server.stop(0)


def _serve(add: Any, servicer: Any, module: Any, name: str, workers: int, transport: Any) -> ServiceServer:
    return create_server(
        "127.0.0.1:0",
        [ServiceBinding(add, servicer, module.DESCRIPTOR.services_by_name[name].full_name)],
        max_workers=workers,
        transport=transport,
    )


@dataclass
class World:
    agent_port: int
    driver: SlowCreates
    provisioner_server: ServiceServer
    catalog: Catalog

    @property
    def agent_address(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    @property
    def provisioner_address(self) -> str:
        return f"127.0.0.1:{self.provisioner_server.port}"


@contextmanager
def world(clock: ManualClock, catalog: Catalog, broken_agent: bool = False) -> Iterator[World]:
    spawn = multiprocessing.get_context("spawn")
    ports, stop = spawn.Queue(), spawn.Event()
    agent = spawn.Process(target=_agent_process, args=(ports, stop, broken_agent), daemon=True)
    agent.start()
    agent_port = int(ports.get(timeout=60))
    driver = SlowCreates(SimCloud(clock), "bench")
    try:
        with serve_provisioner(driver, catalog) as prov:
            yield World(agent_port, driver, prov, catalog)
    finally:
        driver.release()
        stop.set()
        agent.join(10)


# ---- the fleet's rows --------------------------------------------------------------------


def load(
    server: PostgresServer, database: str, catalog: Catalog, queued: int, machines: int, agent: str
) -> str:
    server.psql(f"CREATE DATABASE {database}")
    url = server.url(database)
    upgrade(url)
    engine = make_engine(url)
    with make_sessionmaker(engine)() as session, session.begin():
        sync_catalog(session, catalog)
    engine.dispose()
    workspaces = [w.id for w in catalog.workspaces]
    with psycopg.connect(host="127.0.0.1", port=server.port, user=server.user, dbname=database) as conn:
        with conn.cursor() as cur:
            with cur.copy(
                "COPY machines (id, pool_id, offering_id, provider, region, zone, instance_type, "
                "gpu_model, gpu_count, slots, capacity_type, hourly_price_micros, origin, managed, "
                "workload_class, state, intent, lost, cordoned, provider_instance_id, agent_address, "
                "worker_report_at, requested_at, first_observed_at, state_changed_at, preemption_count, "
                "spot_seconds, start_failures, dispatch_failures, state_changed_by, state_reason) FROM STDIN"
            ) as copy:
                for i in range(machines):
                    copy.write_row(
                        [
                            str(uuid.UUID(int=i + 1)),
                            POOL,
                            "sim-l4x4",
                            "SIM",
                            "sim-1",
                            "sim-1a",
                            "sim.l4x4",
                            "L4",
                            1,
                            SLOTS,
                            "ON_DEMAND",
                            2800000 + i % 7 * 1000,
                            "PROVISIONED",
                            True,
                            "REPORTING",
                            "READY",
                            "RUNNING",
                            False,
                            False,
                            f"sim-{i:08x}",
                            agent,
                            NOW - timedelta(seconds=5),
                            NOW - timedelta(hours=3),
                            NOW - timedelta(hours=3),
                            NOW - timedelta(hours=3),
                            0,
                            0.0,
                            0,
                            0,
                            "worker",
                            "bench",
                        ]
                    )
            job_columns = (
                "id, request_id, request_hash, workspace_id, pool_id, kind_id, pipeline_version, "
                "tenant_values, state, created_at, updated_at, attempt_count, failure_retries_used, "
                "lost_retries_used, "
                "status_message, slot_seconds, charge_micros, cancel_requested, paid_wait_incident"
            )
            with cur.copy(f"COPY jobs ({job_columns}) FROM STDIN") as copy:
                # One running job on one slot of every machine: a quarter of the slots busy.
                for i in range(machines):
                    copy.write_row(
                        [
                            f"r{i}",
                            f"r{i}",
                            "h",
                            workspaces[i % len(workspaces)],
                            POOL,
                            "short_episode",
                            "1",
                            "{}",
                            "RUNNING",
                            NOW - timedelta(hours=1),
                            NOW,
                            1,
                            0,
                            0,
                            "",
                            0.0,
                            0,
                            False,
                            False,
                        ]
                    )
                for i in range(queued):
                    copy.write_row(
                        [
                            f"q{i}",
                            f"q{i}",
                            "h",
                            workspaces[i * 7 % len(workspaces)],
                            POOL,
                            "short_episode",
                            "2026.11.3",
                            '{"topic": "bench"}',
                            "QUEUED",
                            NOW - timedelta(seconds=queued - i),
                            NOW,
                            0,
                            0,
                            0,
                            "",
                            0.0,
                            0,
                            False,
                            False,
                        ]
                    )
            with cur.copy(
                "COPY attempts (id, job_id, machine_id, slot, slots, state, started_at, lease_expires_at, "
                "slot_seconds, charged, charge_micros, status_message, epoch) FROM STDIN"
            ) as copy:
                for i in range(machines):
                    copy.write_row(
                        [
                            f"a{i}",
                            f"r{i}",
                            str(uuid.UUID(int=i + 1)),
                            0,
                            1,
                            "RUNNING",
                            NOW - timedelta(hours=1),
                            NOW + timedelta(days=1),
                            0.0,
                            False,
                            0,
                            "",
                            0,
                        ]
                    )
            # Some fair-share history: finished attempts over the window, uneven by workspace.
            with cur.copy(f"COPY jobs ({job_columns}) FROM STDIN") as copy:
                for i, ws in enumerate(workspaces):
                    copy.write_row(
                        [
                            f"h{i}",
                            f"h{i}",
                            "h",
                            ws,
                            POOL,
                            "short_episode",
                            "1",
                            "{}",
                            "SUCCEEDED",
                            NOW - timedelta(hours=5),
                            NOW,
                            1,
                            0,
                            0,
                            "",
                            0.0,
                            0,
                            False,
                            False,
                        ]
                    )
            with cur.copy(
                "COPY attempts (id, job_id, machine_id, slot, slots, state, started_at, ended_at, "
                "lease_expires_at, slot_seconds, charged, charge_micros, status_message, epoch) FROM STDIN"
            ) as copy:
                for i in range(len(workspaces)):
                    copy.write_row(
                        [
                            f"ha{i}",
                            f"h{i}",
                            str(uuid.UUID(int=i % machines + 1)),
                            1,
                            1,
                            "SUCCEEDED",
                            NOW - timedelta(hours=5),
                            NOW - timedelta(hours=4),
                            NOW,
                            float(i * 37 % 3600),
                            True,
                            0,
                            "",
                            0,
                        ]
                    )
        conn.commit()
        conn.execute("ANALYZE")
    return url


# ---- the baseline: the same writes as bare SQL ------------------------------------------


def bare_sql_writes(server: PostgresServer, database: str, n: int) -> float:
    """Seconds for n attempt inserts, n job updates and n event inserts in one transaction."""
    with psycopg.connect(host="127.0.0.1", port=server.port, user=server.user, dbname=database) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM jobs WHERE id LIKE 'q%%' LIMIT %s", (n,))]
        machines = [r[0] for r in conn.execute("SELECT id FROM machines LIMIT 1")]
        t0 = time.perf_counter()
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO attempts (id, job_id, machine_id, slot, slots, state, started_at, "
                "lease_expires_at, slot_seconds, charged, charge_micros, status_message, epoch) "
                "VALUES (%s, %s, %s, 1, 1, 'STARTING', %s, %s, 0, false, 0, '', 1)",
                [(f"b{j}", j, machines[0], NOW, NOW) for j in ids],
            )
            cur.executemany(
                "UPDATE jobs SET state = 'DISPATCHING', attempt_count = 1, status_message = %s, "
                "updated_at = %s WHERE id = %s",
                [("bench", NOW, j) for j in ids],
            )
            cur.executemany(
                "INSERT INTO job_events (job_id, state, at, message) VALUES (%s, 'DISPATCHING', %s, 'bench')",
                [(j, NOW) for j in ids],
            )
        elapsed = time.perf_counter() - t0
        conn.rollback()
        return elapsed if ids else float("nan")


# ---- the runs ----------------------------------------------------------------------------


@dataclass
class Result:
    queued: int
    machines: int
    burst_s: float = 0.0
    burst_phases: dict[str, float] = field(default_factory=dict)
    assigned: int = 0
    statements: int = 0
    # From the burst tick's start until its last StartJob answered and was recorded.
    started: int = 0
    started_s: float = 0.0
    steady: list[float] = field(default_factory=list)
    steady_snapshot: list[float] = field(default_factory=list)
    steady_phases: dict[str, list[float]] = field(default_factory=dict)
    pending_ticks: list[float] = field(default_factory=list)
    creates: int = 0
    creates_expected: int = 0
    fitting: int = 0
    creates_at_cloud: int = 0
    started_while_pending: int = 0
    last_started_while_pending_s: float = float("nan")
    infra_errors: int = 0
    backed_off: int = 0
    bare_sql_s: float = 0.0

    @property
    def per_s(self) -> float:
        return self.assigned / self.burst_s if self.burst_s else 0.0

    @property
    def started_per_s(self) -> float:
        return self.started / self.started_s if self.started_s else 0.0


class Counter:
    """Statements sent on an engine (to show a tick's writes do not grow per assignment)."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        event.listen(engine, "before_cursor_execute", self._one)

    def _one(self, *_args: Any) -> None:
        self.count += 1


def _scalar(sessions: Any, sql: str, **params: Any) -> int:
    with sessions() as session:
        return int(session.execute(text(sql), params).scalar_one())


def _running(sessions: Any, ids: list[str]) -> int:
    if not ids:
        return 0
    with sessions() as session:
        return int(
            session.execute(
                text("SELECT count(*) FROM attempts WHERE state = 'RUNNING' AND id = ANY(:ids)"), {"ids": ids}
            ).scalar_one()
        )


def _attempt_ids_since(sessions: Any, since: datetime) -> list[str]:
    with sessions() as session:
        rows = session.execute(text("SELECT id FROM attempts WHERE started_at >= :t"), {"t": since})
        return [r[0] for r in rows]


def reported(sessions: Any, now: datetime) -> None:
    """Every machine's worker reports, as real workers do every few seconds (a machine
    whose worker has not reported within GPUFLEET_WORKER_FRESH_S is given no work)."""
    with sessions() as session, session.begin():
        session.execute(text("UPDATE machines SET worker_report_at = :t"), {"t": now})


def _wait(condition: Any, timeout_s: float) -> float:
    """Seconds until ``condition()`` held (NaN if it never did within ``timeout_s``)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if condition():
            return time.perf_counter() - t0
        time.sleep(0.005)
    return float("nan")


def run_size(
    server: PostgresServer,
    queued: int,
    machines: int,
    steady: int,
    create_s: float,
    profile: cProfile.Profile | None = None,
    broken_agent: bool = False,
    cold: bool = False,
) -> Result:
    result = Result(queued, machines)
    clock = ManualClock(NOW)
    catalog = catalogue(500, machines + 20)
    with world(clock, catalog, broken_agent) as w:
        database = f"tick_{queued}_{machines}"
        t0 = time.perf_counter()
        url = load(server, database, catalog, queued, machines, w.agent_address)
        print(f"  loaded {queued:,} queued jobs and {machines:,} machines in {time.perf_counter() - t0:.1f}s")
        # The scheduler's default call settings (pools, deadlines): only what a benchmark
        # without workers must change.
        settings = Settings(
            database_url=url,
            provisioner_address=w.provisioner_address,
            instance_name="bench",
            **tls.settings("scheduler"),
            max_running_machines=machines,
            # No worker reports here: leases must outlast the run, or the steady ticks would
            # be timing lease expiry instead.
            attempt_lease_s=86400.0,
        )
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        counter = Counter(engine)
        lease = LeaderLease("scheduler", "bench", clock, sessions, 3600.0)
        assert lease.try_acquire()
        provisioner = ProvisionerClient(
            w.provisioner_address, tls.transport("scheduler"), timeout_s=settings.provider_call_timeout_s
        )
        tick = FleetTick(sessions, clock, lease, provisioner, settings)
        try:
            if not cold:
                # A scheduler that has been running holds a connection to every ready
                # machine's agent (opened when the machine became ready); --cold measures a
                # new leader's first tick instead, every TLS handshake inside the burst.
                t0 = time.perf_counter()
                ready = [
                    tick.agents.connect(str(uuid.UUID(int=i + 1)), w.agent_address) for i in range(machines)
                ]
                for future in ready:
                    if future is not None:
                        future.result(timeout=120)
                took = time.perf_counter() - t0
                print(f"  connected to {machines:,} agents in {took:.1f}s (before the burst)")
            # The burst: every free slot assigned in one tick, then started on the agent.
            before = counter.count
            t0 = time.perf_counter()
            report = tick.run(clock.now())
            result.burst_s = time.perf_counter() - t0
            result.statements = counter.count - before
            result.assigned = report.actions["assign"]
            result.burst_phases = dict(tick.last_phases)
            tick.settle(600)
            result.started_s = time.perf_counter() - t0
            result.started = _running(sessions, _attempt_ids_since(sessions, NOW))
            result.bare_sql_s = bare_sql_writes(server, database, result.assigned)
            for _ in range(steady):
                clock.advance(timedelta(seconds=5))
                reported(sessions, clock.now())
                if profile is not None:
                    profile.enable()
                t0 = time.perf_counter()
                tick.run(clock.now())
                result.steady.append(time.perf_counter() - t0)
                if profile is not None:
                    profile.disable()
                for phase, took in tick.last_phases.items():
                    result.steady_phases.setdefault(phase, []).append(took)
                tick.settle(60)
            result.steady_snapshot = result.steady_phases.get("snapshot", [])

            # Slow creates beside dispatch, at the default call settings: twenty jobs end (20
            # slots free on ready machines), the ceiling allows 20 more machines, and each
            # create takes create_s at the cloud. The jobs that fit must start meanwhile.
            free = 20
            with sessions() as session, session.begin():
                ended = session.execute(
                    text(
                        "UPDATE attempts SET state = 'SUCCEEDED', ended_at = :t, holds_slot = false "
                        "WHERE id IN (SELECT id FROM attempts WHERE state = 'RUNNING' AND started_at >= :s "
                        "ORDER BY id LIMIT :n) RETURNING job_id"
                    ),
                    {"t": clock.now(), "s": NOW, "n": free},
                ).all()
                session.execute(
                    text("UPDATE jobs SET state = 'SUCCEEDED' WHERE id = ANY(:ids)"),
                    {"ids": [r[0] for r in ended]},
                )
            w.driver.create_s = create_s
            tick.policy = dataclasses.replace(tick.policy, max_running_machines=machines + 20)
            clock.advance(timedelta(seconds=5))
            reported(sessions, clock.now())
            mark = clock.now()
            t0 = time.perf_counter()
            report = tick.run(mark)
            result.pending_ticks.append(time.perf_counter() - t0)
            result.creates += report.actions["create"]
            fitting = _attempt_ids_since(sessions, mark)
            result.fitting = len(fitting)
            # What still waits after the burst and the freed slots, in whole machines.
            result.creates_expected = min(20, -(-(queued - result.assigned - len(fitting)) // SLOTS))
            result.last_started_while_pending_s = (
                _wait(lambda: _running(sessions, fitting) == len(fitting) or w.driver.waiting == 0, 30.0)
                + result.pending_ticks[0]
            )
            result.started_while_pending = _running(sessions, fitting)
            result.creates_at_cloud = w.driver.waiting
            for _ in range(2):
                clock.advance(timedelta(seconds=5))
                t0 = time.perf_counter()
                report = tick.run(clock.now())
                result.pending_ticks.append(time.perf_counter() - t0)
                result.creates += report.actions["create"]
            if w.driver.waiting == 0:
                print("  warning: the creates ended before the jobs that fit were counted")
        finally:
            w.driver.release()
            tick.settle(60)
            result.infra_errors = _scalar(
                sessions, "SELECT count(*) FROM attempts WHERE state = 'INFRA_ERROR'"
            )
            result.backed_off = _scalar(
                sessions,
                "SELECT count(*) FROM machines "
                "WHERE dispatch_failures > 0 OR dispatch_backoff_until IS NOT NULL",
            )
            tick.close()
            provisioner.close()
            engine.dispose()
    return result


def self_check(r: Result) -> list[str]:
    """What the run must have done to report what it reports; each miss is a problem."""
    problems = []
    if r.assigned == 0:
        problems.append("the burst tick assigned nothing")
    if r.started != r.assigned:
        problems.append(f"{r.started:,} of the burst's {r.assigned:,} assignments reached RUNNING")
    if r.infra_errors:
        problems.append(f"{r.infra_errors:,} attempts ended INFRA_ERROR")
    if r.backed_off:
        problems.append(f"{r.backed_off:,} machines were put on dispatch back-off")
    if r.queued - r.assigned < 100:
        return problems  # nothing waits after the burst: no creates case at this size
    if r.creates != r.creates_expected or r.creates == 0:
        problems.append(f"{r.creates} creates were recorded, {r.creates_expected} expected")
    if r.creates_at_cloud == 0:
        problems.append("no create was still at the cloud while the jobs that fit were counted")
    if r.fitting != 20 or r.started_while_pending != r.fitting:
        problems.append(
            f"{r.started_while_pending} of {r.fitting} jobs that fit started while the creates were "
            "pending (20 expected)"
        )
    return problems


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--machines", type=int, default=2_000)
    parser.add_argument("--steady", type=int, default=20, help="steady ticks timed after the burst")
    parser.add_argument("--create-s", type=float, default=60.0, help="how long each pending create takes")
    parser.add_argument("--growth", default="1000:500,5000:1000", help="smaller sizes, queued:machines")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the last size's steady ticks")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="no agent connection open before the burst (a new leader's first tick)",
    )
    parser.add_argument(
        "--broken-agent", action="store_true", help="an agent that refuses every job (the checks must fail)"
    )
    args = parser.parse_args()
    sizes = [tuple(map(int, s.split(":"))) for s in args.growth.split(",") if s] + [
        (args.queued, args.machines)
    ]
    server = start_postgres()
    results: list[Result] = []
    try:
        for queued, machines in sizes:
            print(f"{queued:,} queued, {machines:,} machines x {SLOTS} slots (a quarter busy)", flush=True)
            last = (queued, machines) == sizes[-1]
            profile = cProfile.Profile() if args.profile and last else None
            results.append(
                run_size(
                    server,
                    queued,
                    machines,
                    args.steady,
                    args.create_s,
                    profile,
                    args.broken_agent,
                    args.cold,
                )
            )
            if profile is not None:
                profile.dump_stats(args.profile)
    finally:
        server.stop()

    print()
    print(
        f"{'size':>14} {'burst tick':>11} {'assigned':>9} {'per s':>8} {'bare SQL/s':>11} {'ratio':>6} "
        f"{'stmts':>6} {'started/s':>10} {'steady p50':>11} {'p95':>7} {'snapshot p95':>13}"
    )
    for r in results:
        bare = r.assigned / r.bare_sql_s if r.bare_sql_s else float("nan")
        print(
            f"{r.queued:>6,}/{r.machines:<7,} {r.burst_s:>10.3f}s {r.assigned:>9,} {r.per_s:>8,.0f} "
            f"{bare:>11,.0f} {r.per_s / bare:>6.2f} {r.statements:>6} {r.started_per_s:>10,.0f} "
            f"{statistics.median(r.steady):>10.3f}s {pct(r.steady, 0.95):>6.3f}s "
            f"{pct(r.steady_snapshot, 0.95):>12.3f}s"
        )
    last, first = results[-1], results[0]
    print()
    print(
        f"growth {first.queued:,}/{first.machines:,} -> {last.queued:,}/{last.machines:,}: "
        f"inputs x{(last.queued + last.machines) / (first.queued + first.machines):.1f}, "
        f"burst tick x{last.burst_s / first.burst_s:.1f}, "
        f"steady tick x{statistics.median(last.steady) / statistics.median(first.steady):.1f}, "
        f"snapshot x{statistics.median(last.steady_snapshot) / statistics.median(first.steady_snapshot):.1f}"
    )
    phases = ", ".join(f"{k} {v * 1000:.0f}" for k, v in last.burst_phases.items())
    print(f"burst tick phases at {last.queued:,}/{last.machines:,} (ms): {phases}")
    phases = ", ".join(f"{k} {statistics.median(v) * 1000:.1f}" for k, v in last.steady_phases.items())
    print(f"steady tick phases at {last.queued:,}/{last.machines:,} (median ms): {phases}")
    print(
        f"the burst's {last.assigned:,} assignments reached RUNNING ({last.started:,} started) in "
        f"{last.started_s:.2f}s: {last.started_per_s:,.0f} jobs started/s end to end "
        f"(burst tick {last.burst_s:.2f}s, then the StartJob calls over one agent process)"
    )
    print(
        f"20 creates of {args.create_s:g}s pending at the default call settings "
        f"({last.creates_at_cloud} at the cloud): {last.started_while_pending} of 20 jobs that fit started, "
        f"the last {last.last_started_while_pending_s:.2f}s after the tick began; the ticks took "
        + ", ".join(f"{t:.3f}s" for t in last.pending_ticks)
    )
    print(f"infra errors: {last.infra_errors}, machines backed off: {last.backed_off}")
    print(
        "goals: >= 2,000 jobs started/s, snapshot p95 <= 0.5 s at 10k/2k; "
        "anchors: Slurm ~500 jobs/s, kube-scheduler ~700 pods/s at 5k nodes"
    )
    problems = [f"{r.queued}/{r.machines}: {p}" for r in results for p in self_check(r)]
    print("self-check: " + ("ok" if not problems else "FAILED"))
    for p in problems:
        print(f"  - {p}")
    if args.json:
        print(
            json.dumps(
                {
                    "queued": last.queued,
                    "machines": last.machines,
                    "assignments": last.assigned,
                    "assignments_per_s": round(last.per_s, 1),
                    "bare_sql_assignments_per_s": round(last.assigned / last.bare_sql_s, 1)
                    if last.bare_sql_s
                    else None,
                    "jobs_started": last.started,
                    "jobs_started_per_s": round(last.started_per_s, 1),
                    "burst_tick_s": round(last.burst_s, 4),
                    "burst_statements": last.statements,
                    "tick_p50_s": round(statistics.median(last.steady), 4),
                    "tick_p95_s": round(pct(last.steady, 0.95), 4),
                    "snapshot_p95_s": round(pct(last.steady_snapshot, 0.95), 4),
                    "tick_while_creates_pending_s": round(max(last.pending_ticks), 4),
                    "creates_pending": last.creates,
                    "jobs_started_while_creates_pending": last.started_while_pending,
                    "last_started_while_creates_pending_s": round(last.last_started_while_pending_s, 3),
                    "infra_errors": last.infra_errors,
                    "machines_backed_off": last.backed_off,
                    "self_check": "ok" if not problems else "failed",
                    "problems": problems,
                    "growth": [
                        {
                            "queued": r.queued,
                            "machines": r.machines,
                            "burst_tick_s": round(r.burst_s, 4),
                            "jobs_started_per_s": round(r.started_per_s, 1),
                            "tick_p50_s": round(statistics.median(r.steady), 4),
                            "snapshot_p50_s": round(statistics.median(r.steady_snapshot), 4),
                        }
                        for r in results
                    ],
                }
            )
        )
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
