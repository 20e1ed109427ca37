"""PostgreSQL goes away under the running control plane and comes back (#27 item 4).

Real processes on a PostgreSQL server of the test's own (``own_postgres``, as in
tests/integration/outage): a provisioner with local machines
(agent, worker and runner processes), the scheduler, the reaper and the sweeper, one
shared file clock. The server is stopped ``immediate`` (every connection dropped at once,
as in a crash or a failover) where a job could be lost or run twice, or a healthy
machine destroyed:

- mid-dispatch: a dispatch committed whose StartJob hangs (the machine's agent is
  SIGSTOPped, so the call waits in its socket); the server goes, the agent resumes, the job
  starts on the machine while the scheduler cannot record that it did;
- mid-run: both jobs finish on the machine during the outage, so their completions can
  only be reported after it; meanwhile the clock runs past the attempts' lease (90 s) — the
  renewals were all refused — and the machine's worker is paused while the database
  returns, so a tick that ran at once after the outage would find every attempt's lease
  expired and retry both jobs (each then run twice: with ``GPUFLEET_OUTAGE_SETTLE_S=0``
  this test fails so, both attempts LOST);
- mid-reaper-pass: a second outage, 330 s of clock with the machine idle, past the
  went-silent net's 300 s floor (no grace), its worker again paused while the database
  returns: a net that ran at once would destroy a healthy machine (with the reaper's
  ``GPUFLEET_OUTAGE_SETTLE_S=0`` it does: DESTROYING).

The fleet tick, the reaper's nets and the sweeper's passes run at their cadences all
along (tick 2 s; the reaper's and sweeper's passes each minute or so of clock), so the
outage lands in whichever pass is in flight.

Asserted, as an operator would check: every process stays up; each service's health says
NOT_SERVING during the outage and SERVING after (its liveness, SERVING throughout); a
client's calls during it get UNAVAILABLE with ErrorInfo DATABASE_UNAVAILABLE naming the
database (not UNKNOWN or INTERNAL); after it, each job ran exactly once (one process
started on the machines, one attempt, which succeeded and was charged once), no machine
was stopped, destroyed or marked lost, the ledger holds no failure, and no log a stack.

The outages are 100 and 330 s of clock and a few seconds of wall each; in production the
same mechanism covers a restart of seconds to a failover of a few minutes: the watch probes
every 2 s (back-off to 5 s while down), connects give up after 5 s, and the passes wait
``outage_settle_s`` (30 s) after the database returns, three of the agents' 10 s reports.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import select

from gpufleet.common.db import models
from gpufleet.common.db.enums import MachineState
from gpufleet.common.db.migrate import upgrade
from gpufleet.common.grpcserver import LIVENESS_SERVICE
from gpufleet.common.rich_status import details_of
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import job_pb2, job_service_pb2, reaper_service_pb2, reaper_service_pb2_grpc
from tests.e2e.fleet import Fleet, make_fleet
from tests.e2e.test_scheduler_failover import started_on_machines
from tests.support.postgres import PostgresServer, start_postgres
from tests.support.procs import health_channel

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

WATCHED = ("scheduler", "reaper", "sweeper")


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """Its own server, so stopping it disturbs no other test (durable commits: see
    start_postgres)."""
    server = start_postgres(durable_commits=True)
    server.psql("CREATE DATABASE gpufleet")
    upgrade(server.url("gpufleet"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fleet(own_postgres: PostgresServer) -> Iterator[Fleet]:
    root = Path(tempfile.mkdtemp(prefix="gfdb-", dir="/tmp"))
    # Went silent at its floor (300 s, no grace), so that the second outage (330 s) is
    # longer; the idle timers out of its way (auto-stop's default 300 s would stop the idle
    # machine for good reason).
    fleet = make_fleet(
        root,
        own_postgres.url("gpufleet"),
        went_silent_after_s="300",
        went_silent_grace_s="0",
        idle_stop_after_s="3600",
    )
    try:
        fleet.start_all()
        yield fleet
    finally:
        fleet.close()
        shutil.rmtree(root, ignore_errors=True)


def wait_for(check: Callable[[], object], what: str, timeout_s: float = 20.0) -> None:
    """Real time: the database watch probes in real seconds, whatever the clock does."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


def health(fleet: Fleet, name: str, service: str = "") -> int:
    """Readiness (the default name) unless told: what the liveness probe asks is
    ``gpufleet.liveness``."""
    proc = fleet.procs[name]
    with health_channel(proc.address, name, proc.env) as channel:
        return int(
            health_pb2_grpc.HealthStub(channel)
            .Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
            .status
        )


def all_health(fleet: Fleet, status: int) -> bool:
    return all(health(fleet, name) == status for name in WATCHED)


def attempts(fleet: Fleet, job_id: str) -> list[models.Attempt]:
    with fleet.sessions() as s:
        return list(s.execute(select(models.Attempt).where(models.Attempt.job_id == job_id)).scalars())


def finished_on_machines(fleet: Fleet) -> dict[str, tuple[str, ...]]:
    """Each job's attempts' outcomes as the machines wrote them (result.json)."""
    ended: dict[str, list[str]] = {}
    for result in fleet.machines_root.glob("*/disk/*/*/result.json"):
        job_id = json.loads((result.parent / "spec.json").read_text())["job_id"]
        ended.setdefault(job_id, []).append(str(json.loads(result.read_text())["outcome"]))
    return {job_id: tuple(sorted(outcomes)) for job_id, outcomes in ended.items()}


def test_the_control_plane_rides_out_database_restarts_mid_dispatch_mid_run_and_mid_reaper_pass(
    fleet: Fleet, own_postgres: PostgresServer
) -> None:
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    jobs: dict[str, str] = {}

    def state(name: str) -> int:
        return int(fleet.get_job(jobs[name]).state)

    # A machine comes up and runs a first job; it finishes during the outage.
    jobs["first"] = fleet.submit("first", duration_s=20).job_id
    fleet.advance_until(lambda: state("first") == job_pb2.JOB_STATE_RUNNING, what="first running")
    (machine_id,) = {a.machine_id for a in attempts(fleet, jobs["first"])}
    agent_pid = int((fleet.machines_root / machine_id / "disk" / "agent.pid").read_text())

    # Mid-dispatch: the second job's dispatch is committed, its StartJob hangs.
    os.kill(agent_pid, signal.SIGSTOP)
    try:
        jobs["second"] = fleet.submit("second", duration_s=10).job_id
        fleet.advance_until(
            lambda: any(a.state == "STARTING" for a in attempts(fleet, jobs["second"])),
            step_s=1,
            what="second dispatched",
        )
        own_postgres.shut_down("immediate")
    finally:
        os.kill(agent_pid, signal.SIGCONT)

    # Every service sees it and says so; none dies, nor asks to be restarted (liveness).
    wait_for(lambda: all_health(fleet, not_serving), "every service NOT_SERVING")
    assert {name: health(fleet, name, LIVENESS_SERVICE) for name in WATCHED} == dict.fromkeys(
        WATCHED, serving
    )
    scheduler_channel = fleet.channel(fleet.procs["scheduler"].address)
    with pytest.raises(grpc.RpcError) as refused:
        fleet.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=jobs["first"]), timeout=10)
    reaper_channel = fleet.channel(fleet.procs["reaper"].address, Role.REAPER)
    with pytest.raises(grpc.RpcError) as reaper_refused:
        reaper_service_pb2_grpc.ReaperServiceStub(reaper_channel).ListIncidents(
            reaper_service_pb2.ListIncidentsRequest(), timeout=10
        )
    for err in (refused.value, reaper_refused.value):
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err  # type: ignore[attr-defined]
        assert "database" in (err.details() or ""), err  # type: ignore[attr-defined]
        found = details_of(err)
        assert (found.reason, found.domain) == ("DATABASE_UNAVAILABLE", "gpufleet.dev")
        assert found.retry_after_s is not None and found.retry_after_s > 0
    scheduler_channel.close()

    # Both jobs finish on the machine while it is away (their reports refused, retried by
    # the workers), well within half the attempts' lease, when the machine's own lease
    # fence would stop them (#27 item 5). The clock goes slowly here: the jobs render at it.
    outage_s = 0.0
    while set(finished_on_machines(fleet).values()) != {("SUCCEEDED",)} or len(
        finished_on_machines(fleet)
    ) < len(jobs):
        assert outage_s < 40, (finished_on_machines(fleet), fleet.logs_tail())
        fleet.clock.advance(1.0)
        outage_s += 1.0
        time.sleep(0.15)
    # Then the clock runs past the attempts' 90 s lease, still without the database.
    while outage_s < 100:
        fleet.clock.advance(2.0)
        outage_s += 2.0
        time.sleep(0.05)
    for name, proc in fleet.procs.items():
        assert proc.process.poll() is None, f"{name} died during the outage:\n{proc.log()[-3000:]}"

    # The database returns while the machine's worker is paused, and the clock moves on:
    # a leader that acted at once would find both attempts' leases long expired and retry
    # both jobs (each run twice). It waits ``outage_settle_s`` (30 s) for the reports.
    worker_pid = int((fleet.machines_root / machine_id / "disk" / "worker.pid").read_text())
    os.kill(worker_pid, signal.SIGSTOP)
    try:
        own_postgres.start_again()
        wait_for(lambda: all_health(fleet, serving), "every service SERVING again")
        for _ in range(5):
            fleet.clock.advance(2.0)
            time.sleep(0.3)
    finally:
        os.kill(worker_pid, signal.SIGCONT)
    settled_in_s = 30.0 - 10.0
    while not all(a.state == "SUCCEEDED" for name in jobs for a in attempts(fleet, jobs[name])):
        ended = [a.state for name in jobs for a in attempts(fleet, jobs[name])]
        assert "LOST" not in ended, f"an attempt taken for lost on the outage's silence: {ended}"
        assert settled_in_s > 2, (
            f"the workers' reports did not land before the leaders settled\n{fleet.logs_tail()}"
        )
        fleet.clock.advance(1.0)
        settled_in_s -= 1.0
        time.sleep(0.2)

    fleet.advance_until(
        lambda: all(state(name) == job_pb2.JOB_STATE_SUCCEEDED for name in jobs),
        step_s=2,
        max_virtual_s=600,
        what="both jobs done",
    )
    for name, proc in fleet.procs.items():
        assert proc.process.poll() is None, f"{name} exited:\n{proc.log()[-3000:]}"

    # Each job ran once: one process on the machines, one attempt (succeeded, charged once).
    assert started_on_machines(fleet) == Counter({job_id: 1 for job_id in jobs.values()}), fleet.logs_tail()
    for name, job_id in jobs.items():
        tried = attempts(fleet, job_id)
        assert [a.state for a in tried] == ["SUCCEEDED"], (name, [(a.state, a.status_message) for a in tried])
        assert [a.charged for a in tried] == [True], name
    # No machine was stopped, destroyed or marked lost: the outage's silence is not theirs.
    with fleet.sessions() as s:
        machines = list(s.execute(select(models.Machine)).scalars())
        failures = list(s.execute(select(models.Failure.failure_class)).scalars())
    assert {(m.state, m.lost) for m in machines} == {(MachineState.READY.value, False)}, [
        (m.id, m.state, m.lost) for m in machines
    ]
    assert failures == []

    # Mid-reaper-pass: a second outage, longer than went-silent's 300 s floor, with the
    # machine idle, and again the worker paused while the database returns. The reaper's
    # nets, due since long before, must not read the outage's silence as the machine's.
    own_postgres.shut_down("immediate")
    wait_for(lambda: all_health(fleet, not_serving), "every service NOT_SERVING (second outage)")
    for _ in range(33):
        fleet.clock.advance(10.0)
        time.sleep(0.05)
    os.kill(worker_pid, signal.SIGSTOP)
    try:
        own_postgres.start_again()
        wait_for(lambda: all_health(fleet, serving), "every service SERVING (second outage)")
        back_at = fleet.clock.now()
        for _ in range(5):
            fleet.clock.advance(2.0)
            time.sleep(0.3)
    finally:
        os.kill(worker_pid, signal.SIGCONT)

    def went_silent_ran_since_back() -> bool:
        with fleet.sessions() as s:
            row = s.get(models.WatchdogStat, "went_silent")
            return row is not None and row.last_run_at is not None and row.last_run_at > back_at

    fleet.advance_until(went_silent_ran_since_back, step_s=2, max_virtual_s=300, what="went_silent ran")
    with fleet.sessions() as s:
        machines = list(s.execute(select(models.Machine)).scalars())
        failures = list(s.execute(select(models.Failure.failure_class)).scalars())
    assert {(m.state, m.lost) for m in machines} == {(MachineState.READY.value, False)}, [
        (m.id, m.state, m.lost) for m in machines
    ]
    assert failures == []

    # Each service lived through both, with the one line that says so, and no stack.
    for name in WATCHED:
        log = fleet.procs[name].log()
        assert "the database is unavailable" in log and "the database answers again" in log, name
        stacks = [line[:1500] for line in log.splitlines() if "Traceback" in line]
        assert stacks == [], name
