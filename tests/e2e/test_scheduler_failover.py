"""Two scheduler processes on one PostgreSQL, as two replicas of a deployment run: one leads,
it is SIGKILLed in the middle of a tick, the other takes over within the lease, no job is
lost or started twice, and the API answers through the survivor the whole time.

Real processes: a provisioner with local machines (agent, worker and runner processes), two
schedulers (``scheduler-a`` leads, ``scheduler-b`` stands by and serves the API, the
machines' reports included, as one replica behind a Service would), one shared file clock.

The kill lands in the two places where a leader's death could lose a job or start it twice:

- a dispatch committed whose StartJob has not reached its machine (the machine's agent is
  stopped with SIGSTOP, so the call hangs), and
- a tick blocked inside its own fenced transaction (the test holds the machine's row lock,
  so the tick's write waits on it): the dispatch it was writing is never committed.

"Started" is read on the machines themselves: each attempt folder whose runner started the
job's process (``runner.json`` with a ``job_pid``), grouped by the job its spec names.

Seen here: the hung StartJob reaches the agent when it resumes (the request sat in its
socket), and the survivor takes that attempt's reports; the blocked tick's dispatch is rolled
back with the dead leader's connection, and the survivor dispatches the job itself. Had the
StartJob been lost instead, the survivor's dispatch deadline would take the attempt back and
dispatch again: either way the job starts once, which is what is asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import grpc
import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
from tests.e2e.fleet import Fleet, make_fleet
from tests.support import tls
from tests.support.procs import ServiceProcess

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

TTL_S, RENEW_S = 10.0, 2.0
LEADER, STANDBY = "scheduler-a", "scheduler-b"
JOB_S = 8  # each job renders this many seconds of clock time


@dataclass
class Replicas:
    fleet: Fleet
    engine: Engine
    leader: ServiceProcess
    standby: ServiceProcess

    @property
    def sessions(self) -> sessionmaker[Session]:
        return make_sessionmaker(self.engine)


@pytest.fixture
def replicas(pg_url: str) -> Iterator[Replicas]:
    root = Path(tempfile.mkdtemp(prefix="gffo-", dir="/tmp"))
    fleet = make_fleet(root, pg_url, lease_ttl_s=str(TTL_S), lease_renew_s=str(RENEW_S))
    engine = make_engine(pg_url)
    try:
        fleet.start("provisioner")
        fleet.env["GPUFLEET_PROVISIONER_ADDRESS"] = fleet.procs["provisioner"].address
        leader = start_replica(fleet, LEADER)
        wait_for(lambda: lease_of(engine)[0] == LEADER, f"{LEADER} leads")
        # The machines report to the standby's port, as they would to the Service of both.
        standby = start_replica(fleet, STANDBY, port=fleet.scheduler_port)
        yield Replicas(fleet, engine, leader, standby)
    finally:
        fleet.close()
        engine.dispose()
        shutil.rmtree(root, ignore_errors=True)


def start_replica(fleet: Fleet, name: str, port: int = 0) -> ServiceProcess:
    # Each replica's connections carry its name, so the test can see which one waits on what.
    return fleet.start(
        "scheduler",
        tag=name.removeprefix("scheduler"),
        port=port,
        extra={
            "GPUFLEET_INSTANCE_NAME": name,
            "GPUFLEET_DATABASE_URL": f"{fleet.db_url}?application_name={name}",
        },
    )


def wait_for(
    check: Callable[[], object], what: str, timeout_s: float = 20.0, explain: Callable[[], str] | None = None
) -> None:
    """Real time, for what happens without the clock moving (a process starting, a lock)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s\n{explain() if explain else ''}")
        time.sleep(0.05)


def lease_of(engine: Engine) -> tuple[str, int]:
    with make_sessionmaker(engine)() as s:
        row = s.get(models.LeaderLease, "scheduler")
        return (row.holder, row.epoch) if row else ("", 0)


@dataclass
class ApiWatch:
    """GetJob and ListJobs against one replica, over and over, every failure kept."""

    address: str
    job_ids: list[str]
    calls: list[float] = field(default_factory=list)
    failures: list[tuple[float, str, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="api-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with tls.channel(self.address, Role.SCHEDULER, who=Role.OPERATOR) as channel:
            stub = job_service_pb2_grpc.JobServiceStub(channel)
            n = 0
            while not self._stop.is_set():
                at = time.monotonic()
                try:
                    stub.ListJobs(job_service_pb2.ListJobsRequest(page_size=50), timeout=5)
                    if self.job_ids:
                        job_id = self.job_ids[n % len(self.job_ids)]
                        stub.GetJob(job_service_pb2.GetJobRequest(job_id=job_id), timeout=5)
                    self.calls.append(at)
                except grpc.RpcError as err:
                    self.failures.append((at, str(err.code()), str(err.details())))  # type: ignore[attr-defined]
                n += 1
                self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


def attempts(sessions: sessionmaker[Session], job_id: str) -> list[models.Attempt]:
    with sessions() as s:
        return list(s.execute(select(models.Attempt).where(models.Attempt.job_id == job_id)).scalars())


def started_on_machines(fleet: Fleet) -> Counter[str]:
    """How many times each job's process was started, as the machines' folders show it."""
    runs: Counter[str] = Counter()
    for runner in fleet.machines_root.glob("*/disk/*/*/runner.json"):
        if runner.parent.parent.name not in ("attempts", "finished", "refused"):
            continue
        if json.loads(runner.read_text()).get("job_pid"):
            runs[json.loads((runner.parent / "spec.json").read_text())["job_id"]] += 1
    return runs


def activity(engine: Engine) -> str:
    """Every replica's connections: what each runs and waits on (for a failure's message)."""
    with engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT application_name, state, wait_event_type, left(query, 160) AS query "
                "FROM pg_stat_activity WHERE application_name LIKE 'scheduler-%'"
            )
        )
        return "\n".join(f"{r.application_name} {r.state} {r.wait_event_type} {r.query}" for r in rows)


def blocked_writes(engine: Engine, replica: str) -> list[str]:
    """``replica``'s statements waiting for a lock other than the lease's: a write of its
    tick (the lease row's waiters are its renewals and fences queued behind that write)."""
    with engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT query FROM pg_stat_activity WHERE application_name = :name "
                "AND wait_event_type = 'Lock' AND query NOT ILIKE '%FROM leader_leases%'"
            ),
            {"name": replica},
        )
        return [r.query for r in rows]


def test_the_standby_takes_over_a_leader_killed_mid_tick_and_every_job_runs_once(
    replicas: Replicas,
) -> None:
    fleet, sessions = replicas.fleet, replicas.sessions
    _, leader_epoch = lease_of(replicas.engine)
    jobs: dict[str, str] = {}  # request id -> job id
    watch = ApiWatch(replicas.standby.address, list(jobs.values()))
    watch.start()

    def submit(*names: str) -> None:
        for name in names:
            jobs[name] = fleet.submit(name, duration_s=JOB_S).job_id
            watch.job_ids.append(jobs[name])

    def state(name: str) -> int:
        return int(fleet.get_job(jobs[name]).state)

    # The leader brings up a machine and runs a first job on it.
    submit("before-1")
    fleet.advance_until(lambda: state("before-1") == job_pb2.JOB_STATE_SUCCEEDED, what="before-1 done")
    (machine_id,) = {a.machine_id for a in attempts(sessions, jobs["before-1"])}
    agent_pid = int((fleet.machines_root / machine_id / "disk" / "agent.pid").read_text())

    # 1. A dispatch committed whose StartJob hangs: the machine's agent does not answer.
    os.kill(agent_pid, signal.SIGSTOP)
    try:
        submit("before-2")
        fleet.advance_until(
            lambda: any(a.state == "STARTING" for a in attempts(sessions, jobs["before-2"])),
            step_s=1,
            what="before-2 dispatched",
        )

        # 2. The next tick, blocked inside its fenced write: the machine's row is held here.
        with replicas.engine.connect() as holder:
            holder.execute(text("SELECT id FROM machines WHERE id = :m FOR UPDATE"), {"m": machine_id})
            submit("before-3")  # the machine's second slot is free: it is assigned there
            fleet.clock.advance(2.0)
            wait_for(
                lambda: blocked_writes(replicas.engine, LEADER),
                f"{LEADER}'s tick blocked on the machine's row",
                explain=lambda: activity(replicas.engine) + "\n" + fleet.logs_tail(),
            )
            replicas.leader.process.send_signal(signal.SIGKILL)
            replicas.leader.process.wait(10)
            replicas.leader.expected_exit = True  # type: ignore[attr-defined]
            killed_at, killed_mono = fleet.clock.now(), time.monotonic()
            holder.rollback()
    finally:
        os.kill(agent_pid, signal.SIGCONT)

    # Submitted while no replica leads; the survivor answers.
    submit("after-1", "after-2")

    # The standby takes over within the lease (plus one of its own renewal periods).
    def took_over() -> datetime | None:
        return fleet.clock.now() if lease_of(replicas.engine)[0] == STANDBY else None

    taken_at = fleet.advance_until(took_over, step_s=0.5, real_pause_s=0.1, what="the standby leads")
    taken_mono = time.monotonic()
    assert (taken_at - killed_at).total_seconds() <= TTL_S + RENEW_S + 0.5
    assert lease_of(replicas.engine) == (STANDBY, leader_epoch + 1)

    fleet.advance_until(
        lambda: all(state(name) == job_pb2.JOB_STATE_SUCCEEDED for name in jobs),
        step_s=2,
        max_virtual_s=900,
        what="every job done",
    )
    watch.stop()

    # Every job ran exactly once: started once on the machines, RUNNING once in its story,
    # one attempt succeeded; any other attempt ended without its job having started.
    assert started_on_machines(fleet) == Counter({job_id: 1 for job_id in jobs.values()}), fleet.logs_tail()
    with sessions() as s:
        for name, job_id in jobs.items():
            events = s.execute(
                select(models.JobEvent.state).where(models.JobEvent.job_id == job_id)
            ).scalars()
            assert Counter(events)["RUNNING"] == 1, name
    for name, job_id in jobs.items():
        ended = Counter(a.state for a in attempts(sessions, job_id))
        assert ended["SUCCEEDED"] == 1, (name, ended)

    # The API answered through the survivor all along, the leaderless stretch included.
    assert watch.failures == []
    assert any(killed_mono <= t <= taken_mono for t in watch.calls)
    assert len(watch.calls) > 50
