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
from sqlalchemy import Engine, event

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
    the scheduler's figures are not its own CPU shared with the agent's."""

    def StartJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return agent_service_pb2.AgentServiceStartJobResponse(already_running=False)

    def CancelJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return agent_service_pb2.AgentServiceCancelJobResponse(was_running=False)


def _agent_process(ports: Any, stop: Any) -> None:
    server = _serve(
        agent_service_pb2_grpc.add_AgentServiceServicer_to_server,
        PromptAgent(),
        agent_service_pb2,
        "AgentService",
        16,
    )
    ports.put(server.port)
    stop.wait()
    server.stop(0)


def _serve(add: Any, servicer: Any, module: Any, name: str, workers: int) -> ServiceServer:
    return create_server(
        "127.0.0.1:0",
        [ServiceBinding(add, servicer, module.DESCRIPTOR.services_by_name[name].full_name)],
        max_workers=workers,
        transport=tls.transport("scheduler"),
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
def world(clock: ManualClock, catalog: Catalog) -> Iterator[World]:
    spawn = multiprocessing.get_context("spawn")
    ports, stop = spawn.Queue(), spawn.Event()
    agent = spawn.Process(target=_agent_process, args=(ports, stop), daemon=True)
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
    dispatch_drain_s: float = 0.0
    steady: list[float] = field(default_factory=list)
    pending_ticks: list[float] = field(default_factory=list)
    creates: int = 0
    bare_sql_s: float = 0.0

    @property
    def per_s(self) -> float:
        return self.assigned / self.burst_s if self.burst_s else 0.0


class Counter:
    """Statements sent on an engine (to show a tick's writes do not grow per assignment)."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        event.listen(engine, "before_cursor_execute", self._one)

    def _one(self, *_args: Any) -> None:
        self.count += 1


def run_size(
    server: PostgresServer,
    queued: int,
    machines: int,
    steady: int,
    create_s: float,
    profile: cProfile.Profile | None = None,
) -> Result:
    result = Result(queued, machines)
    clock = ManualClock(NOW)
    catalog = catalogue(500, machines + 20)
    with world(clock, catalog) as w:
        database = f"tick_{queued}_{machines}"
        t0 = time.perf_counter()
        url = load(server, database, catalog, queued, machines, w.agent_address)
        print(f"  loaded {queued:,} queued jobs and {machines:,} machines in {time.perf_counter() - t0:.1f}s")
        settings = Settings(
            database_url=url,
            provisioner_address=w.provisioner_address,
            instance_name="bench",
            **tls.settings("scheduler"),
            max_running_machines=machines,
            call_workers=32,
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
            before = counter.count
            t0 = time.perf_counter()
            report = tick.run(clock.now())
            result.burst_s = time.perf_counter() - t0
            result.statements = counter.count - before
            result.assigned = report.actions["assign"]
            t0 = time.perf_counter()
            tick.settle(600)
            result.dispatch_drain_s = time.perf_counter() - t0
            result.bare_sql_s = bare_sql_writes(server, database, result.assigned)
            for _ in range(steady):
                clock.advance(timedelta(seconds=5))
                if profile is not None:
                    profile.enable()
                t0 = time.perf_counter()
                tick.run(clock.now())
                result.steady.append(time.perf_counter() - t0)
                if profile is not None:
                    profile.disable()
                tick.settle(60)
            # 20 creates that each take create_s: the ceiling allows 20 more machines.
            w.driver.create_s = create_s
            tick.policy = type(tick.policy)(
                max_running_machines=machines + 20,
                worker_fresh_s=settings.worker_fresh_s,
                fair_share_quantum_s=settings.fair_share_quantum_s,
            )
            for _ in range(3):
                clock.advance(timedelta(seconds=5))
                t0 = time.perf_counter()
                report = tick.run(clock.now())
                result.pending_ticks.append(time.perf_counter() - t0)
                result.creates += report.actions["create"]
            assert tick.calls.pending() >= result.creates, "the creates are still in flight"
        finally:
            w.driver.release()
            tick.settle(60)
            tick.close()
            provisioner.close()
            engine.dispose()
    return result


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
            results.append(run_size(server, queued, machines, args.steady, args.create_s, profile))
            if profile is not None:
                profile.dump_stats(args.profile)
    finally:
        server.stop()

    print()
    print(
        f"{'size':>14} {'burst tick':>11} {'assigned':>9} {'per s':>8} {'bare SQL/s':>11} {'ratio':>6} "
        f"{'stmts':>6} {'steady p50':>11} {'p95':>7} {'creates pending':>16}"
    )
    for r in results:
        bare = r.assigned / r.bare_sql_s if r.bare_sql_s else float("nan")
        print(
            f"{r.queued:>6,}/{r.machines:<7,} {r.burst_s:>10.3f}s {r.assigned:>9,} {r.per_s:>8,.0f} "
            f"{bare:>11,.0f} {r.per_s / bare:>6.2f} {r.statements:>6} {statistics.median(r.steady):>10.3f}s "
            f"{pct(r.steady, 0.95):>6.3f}s {max(r.pending_ticks):>15.3f}s"
        )
    last, first = results[-1], results[0]
    print()
    print(
        f"growth {first.queued:,}/{first.machines:,} -> {last.queued:,}/{last.machines:,}: "
        f"inputs x{(last.queued + last.machines) / (first.queued + first.machines):.1f}, "
        f"burst tick x{last.burst_s / first.burst_s:.1f}, "
        f"steady tick x{statistics.median(last.steady) / statistics.median(first.steady):.1f}"
    )
    print(
        f"dispatch of the burst's {last.assigned:,} StartJob calls drained in {last.dispatch_drain_s:.2f}s "
        f"({last.assigned / last.dispatch_drain_s:,.0f}/s over one agent, {32} workers)"
    )
    print(
        f"{last.creates} creates of {args.create_s:g}s each pending: the ticks took "
        + ", ".join(f"{t:.3f}s" for t in last.pending_ticks)
    )
    print(
        "goals: >= 2,000 assignments/s, tick p95 <= 1 s, tick while creates pending <= 2 s; "
        "anchors: Slurm ~500 jobs/s, kube-scheduler ~700 pods/s at 5k nodes"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "queued": last.queued,
                    "machines": last.machines,
                    "assignments": last.assigned,
                    "assignments_per_s": round(last.per_s, 1),
                    "bare_sql_assignments_per_s": round(last.assigned / last.bare_sql_s, 1),
                    "burst_tick_s": round(last.burst_s, 4),
                    "burst_statements": last.statements,
                    "dispatch_drain_s": round(last.dispatch_drain_s, 3),
                    "tick_p50_s": round(statistics.median(last.steady), 4),
                    "tick_p95_s": round(pct(last.steady, 0.95), 4),
                    "tick_while_creates_pending_s": round(max(last.pending_ticks), 4),
                    "creates_pending": last.creates,
                    "growth": [
                        {
                            "queued": r.queued,
                            "machines": r.machines,
                            "burst_tick_s": round(r.burst_s, 4),
                            "tick_p50_s": round(statistics.median(r.steady), 4),
                        }
                        for r in results
                    ],
                }
            )
        )


if __name__ == "__main__":
    main()
