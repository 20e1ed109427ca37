"""How long one full pass of every machine watchdog's scan takes, at 10k and at 100k rows.

Run it as ``.venv/bin/python benchmarks/reaper_scan.py`` (not a test: it prints figures).
It starts its own throwaway PostgreSQL, migrates two databases, fills one with 10,000 and
the other with 100,000 machine rows — a realistic mix, mostly DESTROYED history, with
proportionally more stopped and healthy running machines — and puts the **same** number
of machines due in each for every net (``--due``, default 50). It then times each
watchdog's read side exactly as the reaper runs it (the net's own ``scan``: one query, the
live-attempt count correlated in it, rows turned into snapshots; no provider or agent
call, nothing applied), and prints the time per watchdog, the total, the plan's index,
and the ratio 100k/10k.

The seven nets that look for machines due read a partial index each, so their time
follows the machines due, not the fleet. The idle scanner is the exception by design: it
samples every running machine every 30 seconds, so its scan grows with the running fleet
(here ten times larger at 100k) — it is shown, and totalled, separately.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.migrate import upgrade
from gpufleet.common.db.models import Machine
from gpufleet.reaper.refusal import MachineSnapshot
from gpufleet.reaper.settings import Settings
from tests.support.postgres import PostgresServer, start_postgres

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
COLUMNS = [c.key for c in Machine.__table__.columns]


def _machine(i: int, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict(
        id=str(uuid.UUID(int=i)),
        pool_id=None,
        offering_id="sim-l4",
        provider="SIM",
        region="sim-1",
        zone="sim-1a",
        instance_type="sim.l4",
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
        provider_instance_id=f"sim-{i:08x}",
        agent_address=f"10.0.{i // 250 % 250}.{i % 250}:50060",
        provider_seen_at=NOW - timedelta(seconds=40),
        probe_ok_at=NOW - timedelta(seconds=20),
        probe_failed_since=None,
        worker_report_at=NOW - timedelta(seconds=5),
        requested_at=NOW - timedelta(days=2),
        provision_deadline_at=NOW - timedelta(days=2) + timedelta(minutes=20),
        first_observed_at=NOW - timedelta(days=2) + timedelta(minutes=3),
        state_changed_at=NOW - timedelta(days=1),
        startup_failed_at=None,
        stop_due_at=None,
        destroy_due_at=None,
        preemption_count=0,
        spot_seconds=0.0,
        start_failures=0,
        backoff_until=None,
        pending_call=None,
        pending_call_at=None,
        dispatch_failures=0,
        dispatch_backoff_until=None,
        state_changed_by="",
        state_reason="",
    )
    row.update(values)
    return row


def fleet(total: int, due: int) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """``total`` machine rows with ``due`` machines due for each net; and their attempts."""
    ago = lambda **kw: NOW - timedelta(**kw)  # noqa: E731
    due_sets: list[dict[str, Any]] = [
        # auto-stop: armed, stop past due
        dict(stop_due_at=ago(minutes=1), destroy_due_at=NOW + timedelta(hours=1)),
        # auto-destroy: stopped, destroy past due
        dict(state="STOPPED", intent="STOPPED", destroy_due_at=ago(minutes=1), worker_report_at=ago(hours=3)),
        # provision deadline: booting, never heard from, deadline past
        dict(
            state="BOOTING",
            requested_at=ago(minutes=25),
            provision_deadline_at=ago(minutes=5),
            first_observed_at=ago(minutes=24),
            probe_ok_at=None,
            probe_failed_since=ago(minutes=24),
            worker_report_at=None,
        ),
        # boot failure: up 40 minutes, never reported
        dict(state="BOOTING", first_observed_at=ago(minutes=40), worker_report_at=None),
        # went silent: reported an hour ago
        dict(worker_report_at=ago(hours=1)),
        # lost detector: probe failing 10 minutes, provider still lists it
        dict(probe_ok_at=ago(minutes=11), probe_failed_since=ago(minutes=10)),
        # stuck transition: stopping for an hour
        dict(state="STOPPING", intent="STOPPED", state_changed_at=ago(hours=1)),
    ]
    rows: list[dict[str, Any]] = []
    for values in due_sets:
        rows.extend(_machine(len(rows), **values) for _ in range(due))
    # Booting machines still inside their boot window (boot failure reads and refuses them).
    rows.extend(
        _machine(len(rows), state="BOOTING", first_observed_at=ago(minutes=5), worker_report_at=None)
        for _ in range(due)
    )
    rest = total - len(rows)
    stopped = rest * 5 // 100
    healthy = rest * 10 // 100
    rows.extend(
        _machine(
            len(rows),
            state="STOPPED",
            intent="STOPPED",
            destroy_due_at=NOW + timedelta(hours=1),
            worker_report_at=ago(hours=2),
        )
        for _ in range(stopped)
    )
    rows.extend(_machine(len(rows)) for _ in range(healthy))
    registered = rest // 100
    rows.extend(
        _machine(len(rows), origin="REGISTERED", managed=False, provider_seen_at=None)
        for _ in range(registered)
    )
    while len(rows) < total:  # history: destroyed, every timestamp stale
        rows.append(
            _machine(
                len(rows),
                state="DESTROYED",
                intent="DESTROYED",
                worker_report_at=ago(days=3),
                probe_ok_at=ago(days=3),
                provider_seen_at=ago(days=3),
                state_changed_at=ago(days=3),
            )
        )
    # One finished attempt per destroyed machine, a live one on every fifth healthy one.
    attempts: list[tuple[str, str]] = []
    for row in rows:
        if row["state"] == "DESTROYED":
            attempts.append((row["id"], "SUCCEEDED"))
        elif (
            row["state"] == "READY"
            and row["worker_report_at"] == ago(seconds=5)
            and int(row["id"][-4:], 16) % 5 == 0
        ):
            attempts.append((row["id"], "RUNNING"))
    return rows, attempts


def load(server: PostgresServer, database: str, total: int, due: int) -> str:
    server.psql(f"CREATE DATABASE {database}")
    url = server.url(database)
    upgrade(url)
    rows, attempts = fleet(total, due)
    with psycopg.connect(host="127.0.0.1", port=server.port, user=server.user, dbname=database) as conn:
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO plans (id, tier, weight, max_gpu_jobs, rate_micros) VALUES ('p',0,1,1,1000000)"
            )
            cur.execute(
                "INSERT INTO pools (id, gpu_model, slots_per_machine, warm_target, max_machines) "
                "VALUES ('pool','L4',2,0,4)"
            )
            cur.execute(
                "INSERT INTO job_kinds (id, slots, time_limit_s, runs_writer_code, queue_wait_deadline_s, "
                "retry_budget, lost_retry_budget, resumes_from_checkpoint) "
                "VALUES ('clip',1,3600,true,86400,2,5,false)"
            )
            cur.execute("INSERT INTO workspaces (id, plan_id, active) VALUES ('w','p',true)")
            with cur.copy(f"COPY machines ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row([row[c] for c in COLUMNS])
            with cur.copy(
                "COPY jobs (id, request_id, request_hash, workspace_id, pool_id, kind_id, pipeline_version, "
                "tenant_values, state, created_at, updated_at, attempt_count, failure_retries_used, "
                "lost_retries_used, status_message, slot_seconds, charge_micros, cancel_requested, "
                "paid_wait_incident) FROM STDIN"
            ) as copy:
                for n, (_mid, state) in enumerate(attempts):
                    jid = f"j{n}"
                    copy.write_row(
                        [
                            jid,
                            jid,
                            "h",
                            "w",
                            "pool",
                            "clip",
                            "1",
                            "{}",
                            "RUNNING" if state == "RUNNING" else "SUCCEEDED",
                            NOW,
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
                "COPY attempts (id, job_id, machine_id, slot, slots, state, started_at, lease_expires_at, "
                "slot_seconds, charged, charge_micros, status_message, epoch) FROM STDIN"
            ) as copy:
                for n, (mid, state) in enumerate(attempts):
                    copy.write_row(
                        [
                            f"a{n}",
                            f"j{n}",
                            mid,
                            0,
                            1,
                            state,
                            NOW - timedelta(hours=1),
                            NOW + timedelta(minutes=1),
                            0.0,
                            False,
                            0,
                            "",
                            1,
                        ]
                    )
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
    return url


class _NoCall:
    """Stands in for the provisioner, the agent sampler and prober: a scan calls none of them."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a scan must not call {name}")


def scans(sessions: sessionmaker[Session]) -> dict[str, Callable[[], list[MachineSnapshot]]]:
    """Each watchdog's own scan, built as the reaper builds it (nothing it could call)."""
    from gpufleet.reaper.auto_destroy import AutoDestroy
    from gpufleet.reaper.auto_stop import AutoStop
    from gpufleet.reaper.boot_failure import BootFailure
    from gpufleet.reaper.idle_scanner import IdleScanner
    from gpufleet.reaper.lost_detector import LostDetector
    from gpufleet.reaper.provision_deadline import ProvisionDeadline
    from gpufleet.reaper.stuck_transition import StuckTransition
    from gpufleet.reaper.went_silent import WentSilent

    s = Settings(database_url="postgresql://unused")
    clock = ManualClock(NOW)
    nothing: Any = _NoCall()
    idle = IdleScanner(sessions, nothing, nothing, s.idle_policy())
    stop = AutoStop(sessions, nothing, clock, nothing, s.auto_stop_policy())
    destroy = AutoDestroy(sessions, nothing, clock, nothing, s.auto_destroy_policy())
    deadline = ProvisionDeadline(sessions, nothing, clock, nothing, s.provision_deadline_policy())
    boot = BootFailure(sessions, nothing, clock, nothing, nothing, s.boot_failure_policy())
    silent = WentSilent(sessions, nothing, clock, nothing, s.went_silent_policy())
    lost = LostDetector(sessions, nothing, clock, s.lost_policy())
    stuck = StuckTransition(sessions, nothing, clock, nothing, s.stuck_policy())
    return {
        "auto_stop": lambda: stop.scan(NOW),
        "auto_destroy": lambda: destroy.scan(NOW),
        "provision_deadline": lambda: deadline.scan(NOW),
        "boot_failure": boot.scan,
        "went_silent": lambda: silent.scan(NOW),
        "lost_detector": lambda: lost.scan(NOW),
        "stuck_transition": lambda: stuck.scan(NOW),
        "idle_scanner": idle.scan,
    }


class StatementCapture:
    """The exact SQL (and parameters) a scan sends, so EXPLAIN shows the plan it really gets."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    def __call__(
        self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM machines" in statement:
            self.statements.append((statement, parameters))


def explain(engine: Engine, run: Callable[[], list[MachineSnapshot]]) -> tuple[str, float]:
    """The indexes the scan's real statement reads, and its execution time in PostgreSQL."""
    capture = StatementCapture()
    event.listen(engine, "before_cursor_execute", capture)
    try:
        run()
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    [(statement, params)] = capture.statements
    with engine.connect() as conn:
        plan = conn.exec_driver_sql("EXPLAIN ANALYZE " + statement, params).scalars().all()
    text = "\n".join(plan)
    names = re.findall(r"(?:Index Scan|Index Only Scan|Bitmap Index Scan) (?:using|on) (\w+)", text)
    names = [n for n in dict.fromkeys(names) if not n.startswith("ix_attempts")]
    where = "+".join(names) if names else ("seq scan" if "Seq Scan on machines" in text else "?")
    executed = float(re.findall(r"Execution Time: ([0-9.]+) ms", text)[0])
    return where, executed


def measure(url: str, repeat: int) -> dict[str, tuple[float, int, str, float]]:
    """Per watchdog: median seconds of its whole scan, rows, indexes read, PostgreSQL ms."""
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    out: dict[str, tuple[float, int, str, float]] = {}
    for name, run in scans(sessions).items():
        rows = len(run())  # warm the connection and the caches
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        where, executed = explain(engine, run)
        out[name] = (statistics.median(times), rows, where, executed)
    engine.dispose()
    return out


Result = dict[str, tuple[float, int, str, float]]


def report(cases: list[tuple[int, int]], results: dict[tuple[int, int], Result]) -> None:
    base, top = cases[0], cases[1]
    label = lambda c: f"{c[0]:,} rows / {c[1]} due"  # noqa: E731
    print(f"\n{'watchdog':<20}" + "".join(f"{label(c):>30}" for c in cases) + f"{'ratio':>8}  index read")
    print(f"{'':<20}" + f"{'scan ms (pg ms)   rows':>30}" * len(cases) + f"{f'({top[0] // base[0]}x)':>8}")
    sums: dict[tuple[int, int], list[float]] = {c: [0.0, 0.0, 0.0] for c in cases}
    for name in results[base]:
        cells = ""
        for c in cases:
            sec, rows, _, pg_ms = results[c][name]
            sums[c][0] += sec
            if name != "idle_scanner":
                sums[c][1] += sec
                sums[c][2] += pg_ms / 1000
            cells += f"{sec * 1000:>12.2f} ({pg_ms:>7.2f}) {rows:>6}"
        ratio = results[top][name][0] / results[base][name][0]
        print(f"{name:<20}{cells}{ratio:>8.2f}  {results[top][name][2]}")
    print("-" * (28 + 30 * len(cases) + 12))
    for title, i in (("7 due-driven nets", 1), ("  of which pg", 2), ("full pass, all 8", 0)):
        cells = "".join(f"{sums[c][i] * 1000:>12.2f}{'':>18}" for c in cases)
        print(f"{title:<20}{cells}{sums[top][i] / sums[base][i]:>8.2f}")
    full = sums[top][0]
    verdict = "under" if full < 1.0 else "OVER"
    print(f"\nfull pass at {top[0]:,} rows: {full * 1000:.1f} ms ({verdict} the 1 s target)")
    print(
        "ratio: the same machines due in ten times the rows. The idle scanner samples every running "
        "machine by design, so its scan follows the running fleet (ten times larger here)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cases",
        default="10000:50,100000:50,100000:500",
        help="rows:due per database; the first is the baseline, the second its 10x (same due)",
    )
    parser.add_argument("--repeat", type=int, default=7, help="timed passes per scan (median reported)")
    args = parser.parse_args()
    cases = [(int(r), int(d)) for r, d in (c.split(":") for c in args.cases.split(","))]
    server = start_postgres()
    try:
        results: dict[tuple[int, int], Result] = {}
        for rows, due in cases:
            t0 = time.perf_counter()
            url = load(server, f"bench{rows}_{due}", rows, due)
            print(
                f"loaded {rows:,} machines ({due} due per net) in {time.perf_counter() - t0:.1f}s", flush=True
            )
            results[(rows, due)] = measure(url, args.repeat)
    finally:
        server.stop()
    report(cases, results)


if __name__ == "__main__":
    main()
