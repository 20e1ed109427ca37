"""SubmitJob throughput with concurrent callers over mutual TLS, against a bare grpcio TLS
echo server driven the same way in the same run, and checked against what was stored.

Run it as ``.venv/bin/python benchmarks/submit_job.py`` (not a test: it prints figures;
``--json`` ends with one JSON line). It starts a throwaway PostgreSQL, then for each case a
real scheduler process (``python -m gpufleet.scheduler``, the default catalogue, no
provisioner, the default log level) and drives it over gRPC on loopback from 4 client
processes of 4 threads each — every caller its own channel and connection, every call a new
``request_id``. The cases: ``postgresql`` (one API process: the headline figure),
``pg-traced`` (every span recorded: with no collector configured, spans are not recorded by
default), ``pg-xN`` (``--api-processes`` API processes sharing the port, see
``gpufleet.scheduler.api_processes``) and ``sqlite``. The baseline is an echo server in its
own process — a grpcio server whose one method answers with stored bytes of the size of
SubmitJob's answer — driven by the same clients. It prints calls/s, the ratio to the echo,
p50 and p99 latency, and the CPU per call of the server and of PostgreSQL (from ``/proc``).

It checks that it did the work it reports, and exits non-zero otherwise: no call may fail,
and for every case the jobs stored under that case's request ids are read back — as many
as the calls that succeeded, the very jobs the answers named, each QUEUED with its first
event. A benchmark that counts refusals or lost writes as throughput says nothing.

``--seconds 1 --callers 2 --processes 1 --cases postgresql,sqlite`` is a run of seconds
(the smoke test's, ``tests/benchmarks/test_submit_job_smoke.py``).

Goal: >= 0.4 x the echo, and >= 1,000 jobs/s where the echo gives >= 2,500/s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
from sqlalchemy import func, select

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine
from gpufleet.common.db.migrate import upgrade
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
from tests.support import tls
from tests.support.postgres import PostgresServer, start_postgres
from tests.support.procs import ServiceProcess, start_service

ECHO_METHOD = "/bench.Echo/Echo"
CASES = ("postgresql", "pg-traced", "pg-multi", "sqlite")
GOAL_RATIO = 0.4


def request_prefix(case: str) -> str:
    """Every request id of a case starts so: its jobs are read back by it."""
    return f"bench:{case}:"


def request(case: str, caller: str, n: int) -> job_service_pb2.SubmitJobRequest:
    return job_service_pb2.SubmitJobRequest(
        request_id=f"{request_prefix(case)}{caller}-{n:09d}",
        job=job_pb2.Job(
            workspace="acme-studio",
            pool="l4",
            kind="short_episode",
            pipeline_version="2026.11.3",
            tenant_values={"topic": "volcanoes", "voice": "narrator-2", "length": "60"},
        ),
    )


# ---- the echo baseline --------------------------------------------------------------------


def _echo_process(answer: bytes, ports: Any, stop: Any) -> None:
    from concurrent import futures

    def echo(_request: bytes, _context: grpc.ServicerContext) -> bytes:
        return answer

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {"Echo": grpc.unary_unary_rpc_method_handler(echo, lambda b: b, lambda b: b)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    server.add_generic_rpc_handlers((handler,))
    # Mutual TLS like the scheduler's own port, so the ratio compares like with like.
    port = server.add_secure_port("127.0.0.1:0", tls.transport("scheduler").server_credentials())
    server.start()
    ports.put((port, os.getpid()))
    stop.wait()
    server.stop(0)


# ---- the callers --------------------------------------------------------------------------


@dataclass
class CallerResult:
    """What one caller process saw: its successful calls' latencies and answered job ids,
    its failures, and the window (monotonic clock, shared by processes) it called in."""

    latencies: list[float] = field(default_factory=list)
    job_ids: list[str] = field(default_factory=list)
    errors: int = 0
    first_errors: list[str] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0


def _caller_process(
    address: str, echo: bool, case: str, process: int, seconds: float, threads: int, start: Any, out: Any
) -> None:
    # One connection per caller (a local subchannel pool each), as separate clients would
    # have: with several API processes the kernel spreads connections, not calls.
    channels = [
        tls.channel(address, Role.SCHEDULER, who="backend", options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(threads)
    ]
    for channel in channels:
        grpc.channel_ready_future(channel).result(timeout=30)
    if echo:
        calls = [
            c.unary_unary(ECHO_METHOD, request_serializer=None, response_deserializer=None) for c in channels
        ]
    else:
        calls = [job_service_pb2_grpc.JobServiceStub(c).SubmitJob for c in channels]
    result = CallerResult()
    lock = threading.Lock()

    def run(index: int) -> None:
        call = calls[index]
        latencies: list[float] = []
        job_ids: list[str] = []
        n = 0
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            msg = request(case, f"{process}-{index}", n)
            n += 1
            t0 = time.monotonic()
            try:
                answer = call(msg.SerializeToString() if echo else msg, timeout=30)
            except grpc.RpcError as exc:
                with lock:
                    result.errors += 1
                    if len(result.first_errors) < 5:
                        result.first_errors.append(f"{exc.code()}: {exc.details()}")  # type: ignore[attr-defined]
                continue
            latencies.append(time.monotonic() - t0)
            if not echo:
                job_ids.append(answer.job_id)
        with lock:
            result.latencies.extend(latencies)
            result.job_ids.extend(job_ids)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    start.wait(timeout=120)  # every process connected: all start together
    result.started = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    result.ended = time.monotonic()
    for channel in channels:
        channel.close()
    out.put(result)


# ---- CPU from /proc -----------------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """CPU of ``pid`` and its child processes (the extra API processes; PostgreSQL's
    backends), user + system."""
    pids = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == pid:
                    pids.append(int(entry.name))
            except (OSError, IndexError):
                continue
    total = 0
    for p in pids:
        try:
            fields = _stat(p)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def postmaster_pid(server: PostgresServer) -> int:
    return int((server.root / "data" / "postmaster.pid").read_text().split()[0])


# ---- a case: drive, then read back --------------------------------------------------------


@dataclass
class Figures:
    name: str
    calls: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_call: float
    pg_cpu_ms_per_call: float | None
    errors: int
    first_errors: list[str]
    answered: list[str]  # the job ids the answers named (empty for the echo)

    @property
    def per_s(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0


def drive(
    name: str,
    address: str,
    pid: int,
    echo: bool,
    seconds: float,
    callers: int,
    processes: int,
    pg_pid: int | None = None,
) -> Figures:
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    # The callers connect first, then all start at once with the CPU count: what is counted
    # is what the calls cost, not the callers' start-up.
    start = spawn.Barrier(processes + 1)
    per = callers // processes
    procs = [
        spawn.Process(target=_caller_process, args=(address, echo, name, i, seconds, per, start, out))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    start.wait(timeout=120)
    cpu0, pg0 = cpu_seconds(pid), cpu_seconds(pg_pid) if pg_pid else 0.0
    results: list[CallerResult] = [out.get(timeout=seconds + 180) for _ in procs]
    cpu, pg = cpu_seconds(pid) - cpu0, (cpu_seconds(pg_pid) - pg0) if pg_pid else 0.0
    for p in procs:
        p.join()
    latencies = sorted(x for r in results for x in r.latencies)
    calls = len(latencies)
    return Figures(
        name=name,
        calls=calls,
        seconds=max(r.ended for r in results) - min(r.started for r in results),
        p50_ms=statistics.median(latencies) * 1000 if latencies else float("nan"),
        p99_ms=latencies[int(0.99 * (calls - 1))] * 1000 if latencies else float("nan"),
        cpu_ms_per_call=cpu / calls * 1000 if calls else float("nan"),
        pg_cpu_ms_per_call=pg / calls * 1000 if pg_pid and calls else None,
        errors=sum(r.errors for r in results),
        first_errors=[e for r in results for e in r.first_errors][:5],
        answered=[j for r in results for j in r.job_ids],
    )


@dataclass(frozen=True)
class Stored:
    """What the database holds under a case's request ids."""

    job_ids: frozenset[str]
    not_queued: int
    first_events: int


def read_back(url: str, case: str) -> Stored:
    engine = make_engine(url)
    try:
        mine = models.Job.request_id.startswith(request_prefix(case), autoescape=True)
        with engine.connect() as conn:
            ids = conn.execute(select(models.Job.id).where(mine)).scalars()
            job_ids = frozenset(ids)
            not_queued = conn.execute(
                select(func.count()).select_from(models.Job).where(mine, models.Job.state != "QUEUED"),
            ).scalar_one()
            events = conn.execute(
                select(func.count())
                .select_from(models.JobEvent)
                .join(models.Job, models.Job.id == models.JobEvent.job_id)
                .where(mine, models.JobEvent.state == "QUEUED", models.JobEvent.message == "submitted"),
            ).scalar_one()
    finally:
        engine.dispose()
    return Stored(job_ids, int(not_queued), int(events))


def self_check(echo: Figures, cases: Sequence[tuple[Figures, Stored]]) -> list[str]:
    """Every way the figures could claim work that was not done, as sentences; none is ok.
    Pure: the callers' counts and what was read back, nothing else."""
    problems: list[str] = []
    for figures in (echo, *(f for f, _ in cases)):
        if figures.errors:
            problems.append(
                f"{figures.name}: {figures.errors} calls failed (first: {'; '.join(figures.first_errors)})"
            )
        if figures.calls == 0:
            problems.append(f"{figures.name}: no call succeeded")
    for figures, stored in cases:
        answered = set(figures.answered)
        if len(answered) != len(figures.answered):
            problems.append(
                f"{figures.name}: {len(figures.answered) - len(answered)} answers named a job "
                "another answer had named"
            )
        if len(stored.job_ids) != figures.calls:
            problems.append(
                f"{figures.name}: {figures.calls} calls succeeded but {len(stored.job_ids)} jobs were stored"
            )
        if answered != stored.job_ids:
            problems.append(
                f"{figures.name}: {len(answered - stored.job_ids)} answered jobs are not stored, "
                f"{len(stored.job_ids - answered)} stored jobs were never answered"
            )
        if stored.not_queued:
            problems.append(f"{figures.name}: {stored.not_queued} stored jobs are not QUEUED")
        if stored.first_events != len(stored.job_ids):
            problems.append(
                f"{figures.name}: {stored.first_events} first events for {len(stored.job_ids)} jobs"
            )
    return problems


# ---- the run ------------------------------------------------------------------------------


def echo_answer() -> bytes:
    """Bytes of the size of SubmitJob's answer to the benchmark's request."""
    sent = request("x", "0-0", 0)
    answer = job_pb2.Job(
        name="jobs/00000000-0000-0000-0000-000000000000",
        job_id="00000000-0000-0000-0000-000000000000",
        workspace=sent.job.workspace,
        pool=sent.job.pool,
        kind=sent.job.kind,
        pipeline_version=sent.job.pipeline_version,
        tenant_values=dict(sent.job.tenant_values),
        request_id=sent.request_id,
        state=job_pb2.JOB_STATE_QUEUED,
    )
    answer.create_time.GetCurrentTime()
    answer.update_time.GetCurrentTime()
    return answer.SerializeToString()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each case is driven")
    parser.add_argument("--callers", type=int, default=16, help="concurrent callers, one connection each")
    parser.add_argument("--processes", type=int, default=4, help="client processes the callers are spread on")
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated, from {', '.join(CASES)}; postgresql (the headline) always runs",
    )
    parser.add_argument(
        "--api-processes", type=int, default=2, help="API processes of the pg-multi case (pg-xN)"
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args(argv)
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(f"unknown cases: {', '.join(sorted(unknown))}")
    if args.callers < args.processes or args.callers % args.processes:
        parser.error("--callers must be a multiple of --processes")
    return args


def scheduler_env(url: str, processes: int, traced: bool) -> dict[str, str]:
    return {
        "GPUFLEET_DATABASE_URL": url,
        "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:9",
        "GPUFLEET_MAX_RUNNING_MACHINES": "0",
        "GPUFLEET_API_PROCESSES": str(processes),
        # With no collector, spans are not recorded unless asked for: pg-traced asks.
        **({"OTEL_TRACES_SAMPLER": "always_on"} if traced else {}),
    }


def run(args: argparse.Namespace) -> tuple[Figures, list[tuple[Figures, Stored]]]:
    chosen = set(args.cases.split(",")) | {"postgresql"}
    spawn = multiprocessing.get_context("spawn")
    ports, stop = spawn.Queue(), spawn.Event()
    echo_server = spawn.Process(target=_echo_process, args=(echo_answer(), ports, stop), daemon=True)
    echo_server.start()
    echo_port, echo_pid = ports.get(timeout=60)
    shape = (args.seconds, args.callers, args.processes)
    cases: list[tuple[Figures, Stored]] = []
    server = start_postgres()
    try:
        echo = drive("echo", f"127.0.0.1:{echo_port}", echo_pid, True, *shape)
        print(f"echo: {echo.per_s:,.0f} calls/s", flush=True)
        with tempfile.TemporaryDirectory(prefix="gf-submit-") as tmp:
            server.psql("CREATE DATABASE submit_bench")
            pg, lite = server.url("submit_bench"), f"sqlite:///{Path(tmp) / 'gpufleet.sqlite'}"
            # name, store, API processes, spans recorded, a PostgreSQL to count CPU of
            plan = [
                ("postgresql", pg, 1, False, True),
                ("pg-traced", pg, 1, True, "pg-traced" in chosen),
                (f"pg-x{args.api_processes}", pg, args.api_processes, False, "pg-multi" in chosen),
                ("sqlite", lite, 1, False, "sqlite" in chosen),
            ]
            upgrade(pg)
            for name, url, processes, traced, wanted in plan:
                if not wanted or (name.startswith("pg-x") and processes < 2):
                    continue
                if url == lite:
                    upgrade(lite)
                svc: ServiceProcess = start_service(
                    "scheduler", Path(tmp) / name, scheduler_env(url, processes, traced)
                )
                pg_pid = postmaster_pid(server) if url == pg else None
                try:
                    figures = drive(name, svc.address, svc.process.pid, False, *shape, pg_pid=pg_pid)
                finally:
                    svc.stop()
                cases.append((figures, read_back(url, name)))
                print(
                    f"{name}: {figures.per_s:,.0f} jobs/s ({figures.per_s / echo.per_s:.2f} x echo)",
                    flush=True,
                )
    finally:
        stop.set()
        echo_server.join(10)
        server.stop()
    return echo, cases


def report(args: argparse.Namespace, echo: Figures, cases: list[tuple[Figures, Stored]]) -> int:
    problems = self_check(echo, cases)
    headline = cases[0][0]
    ratio = headline.per_s / echo.per_s if echo.per_s else 0.0
    print()
    print(
        f"SubmitJob, {args.callers} concurrent callers ({args.processes} processes x "
        f"{args.callers // args.processes} threads), {args.seconds:g} s a case"
    )
    print(
        f"{'case':>11} {'calls/s':>9} {'x echo':>7} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'server CPU ms/call':>19} {'pg CPU ms/call':>15} {'errors':>7} {'stored':>7}"
    )
    for figures, stored in [(echo, None), *cases]:
        pg_cpu = f"{figures.pg_cpu_ms_per_call:.2f}" if figures.pg_cpu_ms_per_call is not None else "-"
        print(
            f"{figures.name:>11} {figures.per_s:>9,.0f} {figures.per_s / echo.per_s:>7.2f} "
            f"{figures.p50_ms:>7.2f} {figures.p99_ms:>7.2f} {figures.cpu_ms_per_call:>19.2f} "
            f"{pg_cpu:>15} {figures.errors:>7} {len(stored.job_ids) if stored else '-':>7}"
        )
    print(
        f"ratio: postgresql / echo = {ratio:.2f} (goal >= {GOAL_RATIO}, "
        "and >= 1,000 jobs/s where the echo gives >= 2,500/s)"
    )
    print("self-check: ok" if not problems else "self-check: FAILED")
    for problem in problems:
        print(f"  {problem}")
    if args.json:
        print(
            json.dumps(
                {
                    "jobs_per_s": round(headline.per_s, 1),
                    "echo_per_s": round(echo.per_s, 1),
                    "ratio": round(ratio, 3),
                    "self_check": "ok" if not problems else "failed",
                    "problems": problems,
                    "callers": args.callers,
                    "seconds": args.seconds,
                    "cases": {
                        figures.name: {
                            "per_s": round(figures.per_s, 1),
                            "ratio_to_echo": round(figures.per_s / echo.per_s, 3) if echo.per_s else 0.0,
                            "calls": figures.calls,
                            "stored": len(stored.job_ids) if stored else None,
                            "p50_ms": round(figures.p50_ms, 3),
                            "p99_ms": round(figures.p99_ms, 3),
                            "server_cpu_ms_per_call": round(figures.cpu_ms_per_call, 3),
                            "pg_cpu_ms_per_call": (
                                round(figures.pg_cpu_ms_per_call, 3)
                                if figures.pg_cpu_ms_per_call is not None
                                else None
                            ),
                            "errors": figures.errors,
                        }
                        for figures, stored in [(echo, None), *cases]
                    },
                }
            )
        )
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    echo, cases = run(args)
    return report(args, echo, cases)


if __name__ == "__main__":
    sys.exit(main())
