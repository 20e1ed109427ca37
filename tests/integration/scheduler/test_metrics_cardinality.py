"""Every scheduler metric's series stay bounded however many workspaces use the fleet: the
same scenario played by two workspaces and by 500 records exactly the same series, metric
by metric (kind, plan tier, pool, provider, state, outcome, failure class, ... are the
labels; a workspace never is).

The scenario, through the real parts on PostgreSQL (``metered_fleet``): jobs submitted
through the real SubmitJob, the real fleet tick on a manual clock, the real WorkerService
and JobService. A machine whose agent cannot be reached fails the first dispatches (taken
back, retried); 64 machines then start every job; per kind, one attempt succeeds, one job
is cancelled, one attempt fails and is retried; the capped kind's time limit ends the rest
of its attempts and the others' leases run out (lost, retried). Each metric the scheduler
records (the catalogue's ``gpufleet.scheduler.*``, ``jobs.*``, ``attempts.*``,
``fleet.*``) must have recorded something, and the same series, in both plays.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from datetime import timedelta

from sqlalchemy import insert, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import Catalog, KindSpec, PlanSpec, PoolSpec, WorkspaceSpec
from gpufleet.common.db import models
from gpufleet.common.metrics.catalog import CATALOGUE, FORBIDDEN_LABEL_KEYS
from gpufleet.scheduler.job_service import JobService
from gpufleet.v1 import job_pb2, job_service_pb2
from tests.conftest import fresh_postgres_url
from tests.integration.scheduler.metered_fleet import NOWHERE, MeteredFleet, metered_fleet
from tests.support import tls
from tests.support.fleet_rows import sim_l4_offering
from tests.support.metrics import Series
from tests.support.postgres import PostgresServer

KINDS = ("short", "capped")
SCHEDULER_METRICS = [
    m
    for m in CATALOGUE
    if m.name.startswith(("gpufleet.scheduler.", "gpufleet.jobs.", "gpufleet.attempts.", "gpufleet.fleet."))
]


def catalogue() -> Catalog:
    return Catalog(
        plans=[PlanSpec(id="free", tier=0, max_gpu_jobs=4), PlanSpec(id="studio", tier=1, max_gpu_jobs=4)],
        # The catalogue's own workspace; the played ones are added as rows.
        workspaces=[WorkspaceSpec(id="ws-catalogue", plan="free")],
        kinds=[
            KindSpec(id="short", slots=1, time_limit_s=3600.0),
            KindSpec(id="capped", slots=1, time_limit_s=30.0),
        ],
        pools=[
            PoolSpec(id="l4", slots_per_machine=8, max_machines=100, offerings=[sim_l4_offering(slots=8)])
        ],
    )


def submit(fleet: MeteredFleet, requests: list[job_service_pb2.SubmitJobRequest]) -> None:
    """Through the real SubmitJob, each awaited on a loop of its own thread as the server's
    are, a millisecond apart (so that their order, and so which jobs the first tick takes,
    is the same in both plays)."""
    jobs = JobService(fleet.sessions, fleet.clock, tls.transport("scheduler"), fleet.probe.instruments)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        for request in requests:
            fleet.clock.advance(timedelta(milliseconds=1))
            asyncio.run_coroutine_threadsafe(jobs.SubmitJob(request, None), loop).result(60)  # type: ignore[arg-type]
    finally:
        jobs.close()  # while the loop runs: the statement pool closes on it
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def running_by_kind(sessions: sessionmaker[Session]) -> dict[str, list[models.Attempt]]:
    with sessions() as s:
        rows = s.execute(
            select(models.Attempt, models.Job.kind_id)
            .join(models.Job, models.Job.id == models.Attempt.job_id)
            .where(models.Attempt.state == "RUNNING")
            .order_by(models.Job.created_at, models.Job.id)
        ).all()
    out: dict[str, list[models.Attempt]] = defaultdict(list)
    for attempt, kind in rows:
        out[kind].append(attempt)
    return out


def play(postgres: PostgresServer, workspaces: int, jobs_each: int) -> dict[str, set[Series]]:
    """The scenario with ``workspaces`` workspaces (every other one on the studio plan),
    each submitting ``jobs_each`` jobs of alternating kinds; each scheduler metric's series."""
    with metered_fleet(fresh_postgres_url(postgres), catalogue(), max_running_machines=100) as fleet:
        names = [f"ws-{n:03d}" for n in range(workspaces)]
        with fleet.sessions() as s, s.begin():
            plans = ("studio", "free")
            s.execute(
                insert(models.Workspace), [{"id": w, "plan_id": plans[n % 2]} for n, w in enumerate(names)]
            )
        submit(
            fleet,
            [
                job_service_pb2.SubmitJobRequest(
                    request_id=f"{ws}-{k}",
                    job=job_pb2.Job(
                        workspace=ws, pool="l4", kind=KINDS[(n // 2 + k) % 2], pipeline_version="v1"
                    ),
                )
                for n, ws in enumerate(names)
                for k in range(jobs_each)
            ],
        )
        fleet.machine(agent_address=NOWHERE, slots=8)
        fleet.tick()  # its eight dispatches fail: taken back, retried; it backs off
        for _ in range(64):
            fleet.machine(slots=8)
        report = fleet.tick(after_s=15)  # past the retry back-off: every job starts
        assert report.actions["dispatched"] == workspaces * jobs_each
        running = running_by_kind(fleet.sessions)
        fleet.complete(running["short"][0], job_pb2.ATTEMPT_STATE_SUCCEEDED)
        fleet.cancel(running["short"][1].job_id)
        fleet.complete(running["capped"][0], job_pb2.ATTEMPT_STATE_FAILED)
        fleet.tick(after_s=35)  # the capped kind's limit
        fleet.tick(after_s=60)  # the short attempts' leases ran out (no worker renewed them)
        # Read at once: the gauges report only while the last tick is fresh.
        return {m.name: set(fleet.probe.series(m.name)) for m in SCHEDULER_METRICS}


def test_no_scheduler_metric_grows_a_series_with_the_workspaces(postgres: PostgresServer) -> None:
    few = play(postgres, workspaces=2, jobs_each=4)
    many = play(postgres, workspaces=500, jobs_each=1)

    nothing = [name for name, series in few.items() if not series]
    assert nothing == [], "the scenario must record every scheduler metric"
    grown = {name: (len(few[name]), len(many[name])) for name in few if many[name] != few[name]}
    assert grown == {}
    keys = {key for series in many.values() for labels in series for key, _ in labels}
    assert not keys & FORBIDDEN_LABEL_KEYS
    assert max(len(series) for series in many.values()) < 100  # a handful of kinds, tiers, states
