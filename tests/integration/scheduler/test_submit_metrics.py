"""SubmitJob's counter stays bounded however many workspaces submit: jobs from 500
workspaces make as many series as jobs from one (pool and kind are its labels; a
workspace never is), on both stores, through the real SubmitJob and its real statements.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import load_catalog
from gpufleet.common.clock import ManualClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.metrics.catalog import JOBS_SUBMITTED
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.job_service import JobService
from gpufleet.v1 import job_pb2, job_service_pb2
from tests.support import tls
from tests.support.metrics import MetricsProbe, Series

NOW = datetime(2026, 12, 3, 8, 15, tzinfo=UTC)
WORKSPACES = 500
KINDS = ("short_episode", "clip")


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    with sessions() as session, session.begin():
        sync_catalog(session, load_catalog(None))
        rows = [{"id": f"ws-{n:03d}", "plan_id": "creator", "active": True} for n in range(WORKSPACES)]
        session.execute(insert(models.Workspace), rows)
    yield sessions
    engine.dispose()


def submit_all(jobs: JobService, requests: list[job_service_pb2.SubmitJobRequest]) -> None:
    """Each SubmitJob awaited on a loop of its own thread, as the server's are."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        for request in requests:
            asyncio.run_coroutine_threadsafe(jobs.SubmitJob(request, None), loop).result(60)  # type: ignore[arg-type]
    finally:
        jobs.close()  # while the loop runs: the statement pool closes on it
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def series_after(sessions: sessionmaker[Session], run: str, workspaces: list[str]) -> dict[Series, float]:
    probe = MetricsProbe()
    jobs = JobService(sessions, ManualClock(NOW), tls.transport("scheduler"), probe.instruments)
    requests = [
        job_service_pb2.SubmitJobRequest(
            request_id=f"{run}-{n}",
            job=job_pb2.Job(workspace=ws, pool="l4", kind=KINDS[n % 2], pipeline_version="v1"),
        )
        for n, ws in enumerate(workspaces)
    ]
    submit_all(jobs, requests)
    try:
        return probe.series(JOBS_SUBMITTED.name)
    finally:
        probe.close()


def test_the_submitted_series_do_not_grow_with_the_workspaces(sessions: sessionmaker[Session]) -> None:
    one = series_after(sessions, "one", ["ws-000"] * 4)
    many = series_after(sessions, "many", [f"ws-{n:03d}" for n in range(WORKSPACES)])

    assert set(many) == set(one) == {(("kind", kind), ("pool", "l4")) for kind in KINDS}
    assert sum(many.values()) == WORKSPACES
    assert not any(key == "workspace" for series in many for key, _ in series)
