"""SubmitJob's lean write paths (a prepared statement on PostgreSQL, the kept writer
connection on SQLite) store exactly what the ORM would, on both stores, and queue with
every other writer of the process.

SubmitJob is a coroutine run on the server's event loop; here it runs on a loop of its
own thread as the server's does, so callers on several threads share one loop (and one
statement pool) as a server's callers do."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import load_catalog
from gpufleet.common.clock import ManualClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.errors import NotFound
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.job_service import JobService
from gpufleet.v1 import job_pb2, job_service_pb2
from tests.support import tls

NOW = datetime(2026, 12, 3, 8, 15, 30, 123456, tzinfo=UTC)


def request(request_id: str, **overrides: str) -> job_service_pb2.SubmitJobRequest:
    fields = {"workspace": "acme-studio", "pool": "l4", "kind": "short_episode", "pipeline_version": "v1"}
    fields.update(overrides)
    return job_service_pb2.SubmitJobRequest(
        request_id=request_id,
        job=job_pb2.Job(tenant_values={"topic": "volcanoes", "voice": "çødé ✓"}, **fields),
    )


Submit = Callable[[job_service_pb2.SubmitJobRequest], job_pb2.Job]


@pytest.fixture
def service(db_url: str) -> Iterator[tuple[Submit, sessionmaker[Session]]]:
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    with sessions() as session, session.begin():
        sync_catalog(session, load_catalog(None))
    jobs = JobService(sessions, ManualClock(NOW), tls.transport("scheduler"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def submit(request: job_service_pb2.SubmitJobRequest) -> job_pb2.Job:
        return asyncio.run_coroutine_threadsafe(jobs.SubmitJob(request, None), loop).result(60)  # type: ignore[arg-type]

    yield submit, sessions
    jobs.close()  # while the loop runs: the statement pool closes on it
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
    engine.dispose()


def test_a_submitted_job_reads_back_as_the_orm_would_have_stored_it(
    service: tuple[Submit, sessionmaker[Session]],
) -> None:
    submit, sessions = service
    answer = submit(request("lean-1"))
    with sessions() as session:
        job = session.get(models.Job, answer.job_id)
        assert job is not None
        assert (job.created_at, job.updated_at, job.state) == (NOW, NOW, "QUEUED")
        assert job.tenant_values == {"topic": "volcanoes", "voice": "çødé ✓"}
        assert (job.cancel_requested, job.paid_wait_incident, job.slot_seconds, job.charge_micros) == (
            False,
            False,
            0.0,
            0,
        )
        # Stored in the form SQLAlchemy binds: comparisons in SQL find it to the microsecond.
        assert session.execute(select(models.Job.id).where(models.Job.created_at == NOW)).scalar() == job.id
        later = select(func.count()).select_from(models.Job).where(models.Job.created_at > NOW)
        assert session.execute(later).scalar() == 0
        earlier = models.Job.created_at < NOW + timedelta(microseconds=1)
        assert session.execute(select(func.count()).select_from(models.Job).where(earlier)).scalar() == 1
        [event] = session.execute(select(models.JobEvent).where(models.JobEvent.job_id == job.id)).scalars()
        assert (event.state, event.at, event.message) == ("QUEUED", NOW, "submitted")
    assert submit(request("lean-1")).job_id == answer.job_id


def test_a_catalogue_miss_names_its_field_and_stores_nothing(
    service: tuple[Submit, sessionmaker[Session]],
) -> None:
    submit, sessions = service
    with pytest.raises(NotFound) as err:
        submit(request("miss-1", pool="nowhere"))
    assert err.value.field == "job.pool"
    with sessions() as session:
        assert session.execute(select(func.count()).select_from(models.Job)).scalar() == 0
        assert session.execute(select(func.count()).select_from(models.JobEvent)).scalar() == 0


def test_submissions_and_other_writers_of_the_process_queue_without_locking_errors(
    service: tuple[Submit, sessionmaker[Session]],
) -> None:
    submit, sessions = service
    errors: list[BaseException] = []

    def submitter(t: int) -> None:
        try:
            for n in range(40):
                submit(request(f"t{t}-{n}"))
        except BaseException as exc:
            errors.append(exc)

    def other_writer() -> None:
        try:
            for n in range(40):
                with sessions() as session, session.begin():
                    l4 = models.Pool.id == "l4"
                    session.execute(update(models.Pool).where(l4).values(warm_target=n % 2))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(6)]
    threads += [threading.Thread(target=other_writer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    with sessions() as session:
        assert session.execute(select(func.count()).select_from(models.Job)).scalar() == 240
        assert session.execute(select(func.count()).select_from(models.JobEvent)).scalar() == 240
