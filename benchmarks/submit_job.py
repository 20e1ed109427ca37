"""SubmitJob throughput with 16 concurrent callers, on PostgreSQL and SQLite, against a bare
grpcio echo server with the same message sizes, measured in the same run.

Run it as ``.venv/bin/python benchmarks/submit_job.py`` (not a test: it prints figures). It
starts a throwaway PostgreSQL, then for each store a real scheduler process (``python -m
gpufleet.scheduler``, the default catalogue, no provisioner) and drives it over gRPC on
loopback from 4 client processes of 4 threads each — every caller its own channel and
connection, every call a new ``request_id``. PostgreSQL is measured with one API process and
with ``--api-processes`` (default 2: ``GPUFLEET_API_PROCESSES``, extra processes sharing the
port, see ``gpufleet.scheduler.api_processes``), and once more with every span recorded
(``pg-traced``: with no collector configured, spans are not recorded by default). The
baseline is an echo server in its own process — a grpcio server whose one method answers
with stored bytes of the size of SubmitJob's answer — driven by the same clients. It prints
jobs/s, p50 and p99 latency, the server's CPU per call (from ``/proc``), and the ratio to
the echo.

Goal: >= 1,000 jobs/s and >= 0.3 x the echo.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from gpufleet.common.db.migrate import upgrade
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
from tests.support import tls
from tests.support.postgres import start_postgres
from tests.support.procs import ServiceProcess, start_service

CALLERS, PROCESSES = 16, 4
ECHO_METHOD = "/bench.Echo/Echo"


def request(n: int, tag: str) -> job_service_pb2.SubmitJobRequest:
    return job_service_pb2.SubmitJobRequest(
        request_id=f"bench-{tag}-{n:09d}",
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


def _caller_process(address: str, echo: bool, tag: str, seconds: float, threads: int, out: Any) -> None:
    # One connection per caller (a local subchannel pool each), as 16 separate clients
    # would have: with several API processes the kernel spreads connections, not calls.
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
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def run(index: int) -> None:
        call = calls[index]
        mine: list[float] = []
        n = 0
        start.wait()
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            msg = request(n, f"{tag}-{index}")
            payload = msg.SerializeToString() if echo else msg
            t0 = time.perf_counter()
            try:
                call(payload, timeout=30)
            except grpc.RpcError as exc:
                with lock:
                    errors.append(f"{exc.code()}: {exc.details()}")  # type: ignore[attr-defined]
            mine.append(time.perf_counter() - t0)
            n += 1
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for channel in channels:
        channel.close()
    out.put((latencies, errors[:5], len(errors)))


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """CPU of ``pid`` and its child processes (the extra API processes), user + system."""
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


@dataclass
class Figures:
    name: str
    calls: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_call: float
    errors: int

    @property
    def per_s(self) -> float:
        return self.calls / self.seconds


def drive(name: str, address: str, pid: int, echo: bool, seconds: float) -> Figures:
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    per = CALLERS // PROCESSES
    procs = [
        spawn.Process(target=_caller_process, args=(address, echo, f"{name}{i}", seconds, per, out))
        for i in range(PROCESSES)
    ]
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    wall = time.perf_counter() - t0 - 1.0  # less the callers' start-up, about a second
    cpu = cpu_seconds(pid) - cpu0
    latencies = sorted(x for r in results for x in r[0])
    errors = sum(r[2] for r in results)
    for r in results:
        for e in r[1]:
            print(f"  {name} error: {e}")
    calls = len(latencies)
    return Figures(
        name=name,
        calls=calls,
        seconds=min(max(wall, seconds), seconds + 0.5),
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=latencies[int(0.99 * (calls - 1))] * 1000,
        cpu_ms_per_call=cpu / calls * 1000 if calls else float("nan"),
        errors=errors,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each case is driven")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    parser.add_argument(
        "--api-processes", type=int, default=2, help="API processes for the second PostgreSQL case"
    )
    args = parser.parse_args()
    answer = job_pb2.Job(
        name="jobs/00000000-0000-0000-0000-000000000000",
        job_id="00000000-0000-0000-0000-000000000000",
        workspace="acme-studio",
        pool="l4",
        kind="short_episode",
        pipeline_version="2026.11.3",
        tenant_values=dict(request(0, "x").job.tenant_values),
        request_id=request(0, "x").request_id,
        state=job_pb2.JOB_STATE_QUEUED,
    )
    answer.create_time.GetCurrentTime()
    answer.update_time.GetCurrentTime()

    spawn = multiprocessing.get_context("spawn")
    ports, stop = spawn.Queue(), spawn.Event()
    echo = spawn.Process(target=_echo_process, args=(answer.SerializeToString(), ports, stop), daemon=True)
    echo.start()
    echo_port, echo_pid = ports.get(timeout=60)
    results: list[Figures] = []
    server = start_postgres()
    try:
        results.append(drive("echo", f"127.0.0.1:{echo_port}", echo_pid, True, args.seconds))
        print(f"echo: {results[-1].per_s:,.0f} calls/s", flush=True)
        with tempfile.TemporaryDirectory(prefix="gf-submit-") as tmp:
            server.psql("CREATE DATABASE submit_bench")
            pg, lite = server.url("submit_bench"), f"sqlite:///{Path(tmp) / 'gpufleet.sqlite'}"
            # name, store, API processes, spans recorded (no collector here: by default
            # they are not; "pg-traced" records every one, as a deployment with a
            # collector and no sampling would)
            cases = [("postgresql", pg, 1, False), ("pg-traced", pg, 1, True), ("sqlite", lite, 1, False)]
            if args.api_processes > 1:
                cases.insert(2, (f"pg-x{args.api_processes}", pg, args.api_processes, False))
            for name, url, processes, traced in cases:
                upgrade(url)
                svc: ServiceProcess = start_service(
                    "scheduler",
                    Path(tmp) / name,
                    {
                        "GPUFLEET_DATABASE_URL": url,
                        "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:9",
                        "GPUFLEET_MAX_RUNNING_MACHINES": "0",
                        "GPUFLEET_LOG_LEVEL": "WARNING",
                        "GPUFLEET_API_PROCESSES": str(processes),
                        **({"OTEL_TRACES_SAMPLER": "always_on"} if traced else {}),
                    },
                )
                try:
                    results.append(drive(name, svc.address, svc.process.pid, False, args.seconds))
                finally:
                    svc.stop()
                print(f"{name}: {results[-1].per_s:,.0f} jobs/s", flush=True)
    finally:
        stop.set()
        echo.join(10)
        server.stop()

    base = results[0]
    print()
    print(f"SubmitJob, {CALLERS} concurrent callers ({PROCESSES} processes x {CALLERS // PROCESSES} threads)")
    print(
        f"{'case':>11} {'calls/s':>9} {'x echo':>7} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'server CPU ms/call':>19} {'errors':>7}"
    )
    for r in results:
        print(
            f"{r.name:>11} {r.per_s:>9,.0f} {r.per_s / base.per_s:>7.2f} {r.p50_ms:>7.2f} {r.p99_ms:>7.2f} "
            f"{r.cpu_ms_per_call:>19.2f} {r.errors:>7}"
        )
    print("goal: >= 1,000 jobs/s and >= 0.3 x the echo")
    if args.json:
        print(
            json.dumps(
                {
                    r.name: {
                        "per_s": round(r.per_s, 1),
                        "ratio_to_echo": round(r.per_s / base.per_s, 3),
                        "p50_ms": round(r.p50_ms, 3),
                        "p99_ms": round(r.p99_ms, 3),
                        "server_cpu_ms_per_call": round(r.cpu_ms_per_call, 3),
                        "errors": r.errors,
                    }
                    for r in results
                }
            )
        )


if __name__ == "__main__":
    main()
