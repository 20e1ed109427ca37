"""How long one full pass of every machine watchdog's scan takes, at 10k and at 100k rows.

    .venv/bin/python benchmarks/reaper_scan.py [--sizes 10000,100000] [--due 50] [--repeat 7] [--json]

Not a test: it prints figures. It starts its own throwaway PostgreSQL, migrates one
template database and copies it once per size, fills each copy with that many machine
rows — a realistic mix, mostly DESTROYED history, with proportionally more stopped and
healthy running machines — and plants the **same** number of machines due for every net
(``--due``) at every size. It then times each watchdog's read side exactly as the reaper
runs it (the net's own ``scan``: one query, the live-attempt count correlated in it, rows
turned into snapshots; no provider or agent call, nothing applied), and prints the time
per watchdog, the total, the plan's index, and the ratio last/first size.

The seven nets that look for machines due read a partial index each, so their time
follows the machines due, not the fleet. The idle scanner is the exception by design: it
samples every running machine every 30 seconds, so its scan grows with the running fleet
(here 8.5 times more machines sampled at 100k than at 10k) — it is shown, and totalled,
separately.

Self-check: figures for a scan that read the wrong machines are worthless (this benchmark
once went unrun for several schema changes), so before trusting them it checks that every
net found every machine planted due for it, found the same number at every size (else the
ratio compares unequal work), and that the idle scanner read exactly the running machines
it must sample. Any failure is printed and the exit status is 1. ``--json`` ends the
output with one JSON line of the figures, ``self_check`` and the counts found per net.
Every row it writes is completed from its SQLAlchemy model's own defaults, so a column
added later needs no change here unless it is NOT NULL without a default (then it says so).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg.types.json import Json
from sqlalchemy import JSON, Engine, Table, event
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.schema import ColumnDefault

from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.enums import RUNNING_STATES, MachineOrigin, MachineState
from gpufleet.common.db.migrate import upgrade
from gpufleet.common.db.models import Attempt, Base, Job, JobKind, Machine, Plan, Pool, Workspace
from gpufleet.reaper.refusal import MachineSnapshot
from gpufleet.reaper.settings import Settings
from tests.support.postgres import PostgresServer, start_postgres

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
IDLE = "idle_scanner"
_RUNNING = frozenset(s.value for s in RUNNING_STATES)


class ModelRows:
    """Complete rows for one table from its SQLAlchemy model, for COPY.

    COPY names every column, so a hand-written row breaks the day a column is added (this
    benchmark crashed on ``earmarked_for``). Here a row is the model's own defaults (its
    Python default, else NULL where the column allows it) overlaid with what the benchmark
    states; a NOT NULL column without a default cannot be guessed and is refused by name.
    """

    def __init__(self, model: type[Base]) -> None:
        self.table: Table = Base.metadata.tables[model.__tablename__]
        table = self.table
        self.columns = [c.key for c in table.columns]
        self.defaults: dict[str, Any] = {}
        self.factories: dict[str, Callable[[Any], Any]] = {}
        self.required: set[str] = set()
        self.json_columns = {c.key for c in table.columns if isinstance(c.type, JSON)}
        for column in table.columns:
            default = column.default
            if isinstance(default, ColumnDefault) and default.is_scalar:
                self.defaults[column.key] = default.arg
            elif isinstance(default, ColumnDefault) and default.is_callable:
                self.factories[column.key] = default.arg  # called per row: SQLAlchemy passes a context
            elif column.nullable:
                self.defaults[column.key] = None
            else:
                self.required.add(column.key)

    def row(self, **values: Any) -> dict[str, Any]:
        """The defaults overlaid with ``values``; unknown or missing required columns raise."""
        unknown = values.keys() - set(self.columns)
        missing = self.required - values.keys()
        if unknown or missing:
            raise ValueError(
                f"{self.table.name}: unknown columns {sorted(unknown)}, "
                f"NOT NULL columns with no default and no value {sorted(missing)}"
            )
        made = {key: factory(None) for key, factory in self.factories.items() if key not in values}
        return {**self.defaults, **made, **values}

    def copy(self, cur: psycopg.Cursor[Any], rows: Sequence[Mapping[str, Any]]) -> None:
        """COPY ``rows`` (made by ``row``) into the table, every column named."""
        with cur.copy(f"COPY {self.table.name} ({', '.join(self.columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(
                    [
                        Json(row[c]) if c in self.json_columns and row[c] is not None else row[c]
                        for c in self.columns
                    ]
                )


MACHINES = ModelRows(Machine)


def _machine(i: int, **values: Any) -> dict[str, Any]:
    """A healthy, reporting READY machine we provisioned, overlaid with ``values``."""
    fields: dict[str, Any] = dict(
        id=str(uuid.UUID(int=i)),
        offering_id="sim-l4",
        provider="SIM",
        region="sim-1",
        zone="sim-1a",
        instance_type="sim.l4",
        gpu_model="L4",
        slots=2,
        hourly_price_micros=800_000,
        origin=MachineOrigin.PROVISIONED.value,
        state=MachineState.READY.value,
        intent="RUNNING",
        provider_instance_id=f"sim-{i:08x}",
        agent_address=f"10.0.{i // 250 % 250}.{i % 250}:50060",
        provider_seen_at=NOW - timedelta(seconds=40),
        probe_ok_at=NOW - timedelta(seconds=20),
        worker_report_at=NOW - timedelta(seconds=5),
        requested_at=NOW - timedelta(days=2),
        provision_deadline_at=NOW - timedelta(days=2) + timedelta(minutes=20),
        first_observed_at=NOW - timedelta(days=2) + timedelta(minutes=3),
        state_changed_at=NOW - timedelta(days=1),
    )
    fields.update(values)
    return MACHINES.row(**fields)


def _ago(**delta: float) -> datetime:
    return NOW - timedelta(**delta)


# Per net, what makes a machine due for it (each overlaid on a healthy READY machine).
DUE: dict[str, dict[str, Any]] = {
    "auto_stop": dict(stop_due_at=_ago(minutes=1), destroy_due_at=NOW + timedelta(hours=1)),
    "auto_destroy": dict(
        state="STOPPED", intent="STOPPED", destroy_due_at=_ago(minutes=1), worker_report_at=_ago(hours=3)
    ),
    # Booting, never heard from, deadline past.
    "provision_deadline": dict(
        state="BOOTING",
        requested_at=_ago(minutes=25),
        provision_deadline_at=_ago(minutes=5),
        first_observed_at=_ago(minutes=24),
        probe_ok_at=None,
        probe_failed_since=_ago(minutes=24),
        worker_report_at=None,
    ),
    # Up 40 minutes, never reported.
    "boot_failure": dict(state="BOOTING", first_observed_at=_ago(minutes=40), worker_report_at=None),
    "went_silent": dict(worker_report_at=_ago(hours=1)),
    # Probe failing 10 minutes, the provider still lists it.
    "lost_detector": dict(probe_ok_at=_ago(minutes=11), probe_failed_since=_ago(minutes=10)),
    "stuck_transition": dict(state="STOPPING", intent="STOPPED", state_changed_at=_ago(hours=1)),
}


@dataclass(frozen=True)
class Expected:
    """What one scan must have read: ``ids`` at least, or exactly when ``exact``."""

    ids: frozenset[str]
    exact: bool = False


@dataclass
class Fleet:
    """The rows of one size, their attempts, and what each scan must find among them."""

    machines: list[dict[str, Any]]
    attempts: list[tuple[str, str]]  # (machine id, attempt state)
    expected: dict[str, Expected]


def sampled_by_idle_scanner(row: Mapping[str, Any]) -> bool:
    """The idle scanner's domain, said independently of its SQL: live machines we
    provisioned and manage, with an agent, running or with a stop or destroy timer armed."""
    return (
        row["origin"] == MachineOrigin.PROVISIONED.value
        and row["managed"] is True
        and row["agent_address"] is not None
        and row["state"] != MachineState.DESTROYED.value
        and (row["state"] in _RUNNING or row["stop_due_at"] is not None or row["destroy_due_at"] is not None)
    )


def planted_rows(due: int) -> int:
    """Rows planted before the filler: ``due`` per net, and as many booting in their window."""
    return (len(DUE) + 1) * due


def fleet(total: int, due: int) -> Fleet:
    """``total`` machine rows with ``due`` machines due for each net; and their attempts."""
    ids = itertools.count()
    rows: list[dict[str, Any]] = []
    expected: dict[str, Expected] = {}
    for net, values in DUE.items():
        planted = [_machine(next(ids), **values) for _ in range(due)]
        rows.extend(planted)
        expected[net] = Expected(frozenset(r["id"] for r in planted))
    # Booting machines still inside their boot window (boot failure reads and refuses them).
    rows.extend(
        _machine(next(ids), state="BOOTING", first_observed_at=_ago(minutes=5), worker_report_at=None)
        for _ in range(due)
    )
    if total < planted_rows(due):
        raise ValueError(f"{total:,} rows cannot hold {planted_rows(due):,} planted machines ({due} per net)")
    rest = total - len(rows)
    stopped, healthy, registered = rest * 5 // 100, rest * 10 // 100, rest // 100
    rows.extend(
        _machine(
            next(ids),
            state="STOPPED",
            intent="STOPPED",
            destroy_due_at=NOW + timedelta(hours=1),
            worker_report_at=_ago(hours=2),
        )
        for _ in range(stopped)
    )
    rows.extend(_machine(next(ids)) for _ in range(healthy))
    rows.extend(
        _machine(next(ids), origin="REGISTERED", managed=False, provider_seen_at=None)
        for _ in range(registered)
    )
    stale = dict(
        state="DESTROYED",
        intent="DESTROYED",
        worker_report_at=_ago(days=3),
        probe_ok_at=_ago(days=3),
        provider_seen_at=_ago(days=3),
        state_changed_at=_ago(days=3),
    )
    rows.extend(_machine(next(ids), **stale) for _ in range(total - len(rows)))  # history
    expected[IDLE] = Expected(frozenset(r["id"] for r in rows if sampled_by_idle_scanner(r)), exact=True)
    # One finished attempt per destroyed machine, a live one on every fifth healthy one.
    attempts: list[tuple[str, str]] = []
    for row in rows:
        if row["state"] == "DESTROYED":
            attempts.append((row["id"], "SUCCEEDED"))
        elif (
            row["state"] == "READY"
            and row["worker_report_at"] == _ago(seconds=5)
            and int(row["id"][-4:], 16) % 5 == 0
        ):
            attempts.append((row["id"], "RUNNING"))
    return Fleet(rows, attempts, expected)


def load(server: PostgresServer, template: str, database: str, fleet: Fleet) -> str:
    """A copy of the migrated ``template`` holding ``fleet``, analysed; its URL."""
    server.psql(f"CREATE DATABASE {database} TEMPLATE {template}")
    plans, pools, kinds, workspaces = (
        ModelRows(Plan),
        ModelRows(Pool),
        ModelRows(JobKind),
        ModelRows(Workspace),
    )
    jobs, attempts = ModelRows(Job), ModelRows(Attempt)
    with psycopg.connect(host="127.0.0.1", port=server.port, user=server.user, dbname=database) as conn:
        with conn.cursor() as cur:
            plans.copy(cur, [plans.row(id="p")])
            pools.copy(cur, [pools.row(id="pool", gpu_model="L4", slots_per_machine=2)])
            kinds.copy(cur, [kinds.row(id="clip", time_limit_s=3600.0)])
            workspaces.copy(cur, [workspaces.row(id="w", plan_id="p")])
            MACHINES.copy(cur, fleet.machines)
            jobs.copy(
                cur,
                [
                    jobs.row(
                        id=f"j{n}",
                        request_id=f"j{n}",
                        request_hash="h",
                        workspace_id="w",
                        pool_id="pool",
                        kind_id="clip",
                        pipeline_version="1",
                        state=state,
                        created_at=NOW,
                        updated_at=NOW,
                        attempt_count=1,
                    )
                    for n, (_, state) in enumerate(fleet.attempts)
                ],
            )
            attempts.copy(
                cur,
                [
                    attempts.row(
                        id=f"a{n}",
                        job_id=f"j{n}",
                        machine_id=machine_id,
                        slot=0,
                        state=state,
                        started_at=NOW - timedelta(hours=1),
                        lease_expires_at=NOW + timedelta(minutes=1),
                        epoch=1,
                    )
                    for n, (machine_id, state) in enumerate(fleet.attempts)
                ],
            )
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
    return server.url(database)


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
        "boot_failure": lambda: boot.scan(NOW),
        "went_silent": lambda: silent.scan(NOW),
        "lost_detector": lambda: lost.scan(NOW),
        "stuck_transition": lambda: stuck.scan(NOW),
        IDLE: idle.scan,
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


@dataclass(frozen=True)
class NetFigures:
    """One scan at one size: median seconds, the machines it read, index, PostgreSQL ms."""

    seconds: float
    found: frozenset[str]
    index: str
    pg_ms: float


@dataclass(frozen=True)
class SizeRun:
    """Every scan's figures at one size, beside what each must have found."""

    rows: int
    expected: Mapping[str, Expected]
    nets: Mapping[str, NetFigures]


def measure(url: str, repeat: int) -> dict[str, NetFigures]:
    """Per watchdog: its scan timed ``repeat`` times, and what the first (warming) pass read."""
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    out: dict[str, NetFigures] = {}
    for name, run in scans(sessions).items():
        found = frozenset(m.machine_id for m in run())  # also warms the connection and caches
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        where, executed = explain(engine, run)
        out[name] = NetFigures(statistics.median(times), found, where, executed)
    engine.dispose()
    return out


def self_check(runs: Sequence[SizeRun]) -> list[str]:
    """What is wrong with the work the figures claim (empty: nothing).

    Each scan must have read every machine planted for it (exactly that set where
    ``exact``). A due-driven net must also read as many machines at every size: the
    same machines are due everywhere, and the ratio only means something for equal work.
    """
    problems: list[str] = []
    for run in runs:
        for net, want in run.expected.items():
            figures = run.nets.get(net)
            if figures is None:
                problems.append(f"{run.rows:,} rows: {net} was not measured")
                continue
            missing, extra = want.ids - figures.found, figures.found - want.ids
            if missing:
                problems.append(
                    f"{run.rows:,} rows: {net} found {len(want.ids) - len(missing)} of the {len(want.ids)} "
                    f"machines it must read ({len(missing)} missing, e.g. {sorted(missing)[0]})"
                )
            if want.exact and extra:
                problems.append(
                    f"{run.rows:,} rows: {net} read {len(extra)} machines it must not "
                    f"(e.g. {sorted(extra)[0]})"
                )
    for net in runs[0].expected if runs else ():
        if runs[0].expected[net].exact:
            continue
        counts = {run.rows: len(run.nets[net].found) for run in runs if net in run.nets}
        if len(set(counts.values())) > 1:
            problems.append(
                f"{net} read "
                + ", ".join(f"{n} at {rows:,} rows" for rows, n in counts.items())
                + ": the same machines are due at every size, so its ratio would compare unequal work"
            )
    return problems


def _totals(run: SizeRun) -> tuple[float, float, float]:
    """Seconds of the due-driven nets, their PostgreSQL seconds, and the full pass of all."""
    due = [f for net, f in run.nets.items() if net != IDLE]
    return (
        sum(f.seconds for f in due),
        sum(f.pg_ms for f in due) / 1000,
        sum(f.seconds for f in run.nets.values()),
    )


def report(runs: Sequence[SizeRun], due: int) -> None:
    """The table: per watchdog and size, scan ms, PostgreSQL ms, rows read; the ratio."""
    base, top = runs[0], runs[-1]
    cells = [f"{run.rows:,} rows / {due} due" for run in runs]
    print(f"\n{'watchdog':<20}" + "".join(f"{c:>30}" for c in cells) + f"{'ratio':>8}  index read")
    times = f"({top.rows / base.rows:g}x)"
    print(f"{'':<20}" + f"{'scan ms (pg ms)   rows':>30}" * len(runs) + f"{times:>8}")
    for net, first in base.nets.items():
        line = "".join(
            f"{r.nets[net].seconds * 1000:>12.2f} ({r.nets[net].pg_ms:>7.2f}) {len(r.nets[net].found):>6}"
            for r in runs
        )
        print(f"{net:<20}{line}{top.nets[net].seconds / first.seconds:>8.2f}  {top.nets[net].index}")
    print("-" * (28 + 30 * len(runs) + 12))
    sums = [_totals(run) for run in runs]
    for title, i in (("7 due-driven nets", 0), ("  of which pg", 1), ("full pass, all 8", 2)):
        line = "".join(f"{s[i] * 1000:>12.2f}{'':>18}" for s in sums)
        print(f"{title:<20}{line}{sums[-1][i] / sums[0][i]:>8.2f}")
    full = sums[-1][2]
    verdict = "under" if full < 1.0 else "OVER"
    print(f"\nfull pass at {top.rows:,} rows: {full * 1000:.1f} ms ({verdict} the 1 s target)")
    print(
        "ratio: the same machines due in more rows. The idle scanner samples every running "
        "machine by design, so its scan follows the running fleet."
    )


def figures(runs: Sequence[SizeRun], due: int, repeat: int, problems: Sequence[str]) -> dict[str, Any]:
    """The JSON line: per size and net the times and machines found; the ratios; the check."""
    base, top = runs[0], runs[-1]
    ratio = {net: round(top.nets[net].seconds / base.nets[net].seconds, 3) for net in base.nets}
    (due_base, _, full_base), (due_top, _, full_top) = _totals(base), _totals(top)
    ratio["due_driven"] = round(due_top / due_base, 3)
    ratio["full_pass"] = round(full_top / full_base, 3)
    return {
        "sizes": [run.rows for run in runs],
        "due": due,
        "repeat": repeat,
        "self_check": "failed" if problems else "ok",
        "problems": list(problems),
        "runs": [
            {
                "rows": run.rows,
                "nets": {
                    net: {
                        "scan_ms": round(f.seconds * 1000, 3),
                        "pg_ms": round(f.pg_ms, 3),
                        "found": len(f.found),
                        "planted": len(run.expected[net].ids),
                        "index": f.index,
                    }
                    for net, f in run.nets.items()
                },
                "due_driven_ms": round(_totals(run)[0] * 1000, 3),
                "due_driven_pg_ms": round(_totals(run)[1] * 1000, 3),
                "full_pass_ms": round(_totals(run)[2] * 1000, 3),
            }
            for run in runs
        ],
        "ratio": ratio,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--sizes", default="10000,100000", help="machine rows per database, comma-separated; ratio last/first"
    )
    parser.add_argument("--due", type=int, default=50, help="machines planted due per net, at every size")
    parser.add_argument("--repeat", type=int, default=7, help="timed passes per scan (median reported)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if len(sizes) < 2 or args.due < 1 or args.repeat < 1:
        parser.error("give at least two sizes, --due >= 1 and --repeat >= 1")
    if min(sizes) < planted_rows(args.due):
        parser.error(
            f"every size must hold the {planted_rows(args.due):,} machines planted (--due {args.due})"
        )
    server = start_postgres()
    runs: list[SizeRun] = []
    try:
        server.psql("CREATE DATABASE bench_template")
        upgrade(server.url("bench_template"))
        for n, rows in enumerate(sizes):
            t0 = time.perf_counter()
            machines = fleet(rows, args.due)  # one size's rows in memory at a time
            url = load(server, "bench_template", f"bench{n}_{rows}", machines)
            print(
                f"loaded {rows:,} machines ({args.due} due per net) in {time.perf_counter() - t0:.1f}s",
                flush=True,
            )
            runs.append(SizeRun(rows, machines.expected, measure(url, args.repeat)))
    finally:
        server.stop()
    report(runs, args.due)
    problems = self_check(runs)
    if problems:
        print(f"\nself-check: FAILED ({len(problems)} problems); the figures above are not to be trusted:")
        for problem in problems:
            print(f"  - {problem}")
    else:
        print(
            f"\nself-check: ok — at every size each net read all {args.due} machines planted due for it "
            f"(the same count at every size), and the idle scanner exactly the running machines it samples"
            f" ({', '.join(f'{len(r.expected[IDLE].ids):,}' for r in runs)})"
        )
    if args.json:
        print(json.dumps(figures(runs, args.due, args.repeat, problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
