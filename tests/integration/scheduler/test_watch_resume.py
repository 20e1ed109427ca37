"""WatchJob's resume point, through a real scheduler process, real gRPC with TLS and real
PostgreSQL: every event carries its sequence (live ones too), a stream opened with
``after_sequence`` gets exactly the later events, and no event is ever skipped — not when
ids commit out of order across jobs, and not within a job, whose writers take its row lock
before their event takes an id."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.enums import JobState
from gpufleet.common.job_writer import set_job_state
from gpufleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
from tests.support.procs import ServiceProcess
from tests.support.rich_errors import assert_bad_request, refusal

J = job_service_pb2
Stub = job_service_pb2_grpc.JobServiceStub


@pytest.fixture
def jobs(scheduler: ServiceProcess) -> Iterator[Stub]:
    with scheduler.channel("backend") as channel:
        yield job_service_pb2_grpc.JobServiceStub(channel)


@pytest.fixture
def sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(pg_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def submit(jobs: Stub) -> str:
    job = jobs.SubmitJob(
        J.SubmitJobRequest(
            request_id=str(uuid.uuid4()),
            job=job_pb2.Job(
                workspace="acme-studio", pool="l4", kind="short_episode", pipeline_version="2026.11.3"
            ),
        ),
        timeout=5,
    )
    return str(job.job_id)


def watch(jobs: Stub, job_id: str, after: int = 0) -> list[job_pb2.JobEvent]:
    return list(jobs.WatchJob(J.WatchJobRequest(job_id=job_id, after_sequence=after), timeout=10))


def stored_ids(sessions: sessionmaker[Session], job_id: str) -> list[int]:
    with sessions() as s:
        E = models.JobEvent
        return list(s.execute(select(E.id).where(E.job_id == job_id).order_by(E.id)).scalars())


def until_message(stream: Iterator[job_pb2.JobEvent], message: str) -> job_pb2.JobEvent:
    """The stream's next event with ``message`` (the fleet tick may add waiting reasons)."""
    for event in stream:
        if event.message == message:
            return event
    raise AssertionError(f"the stream ended without {message!r}")


def test_a_resumed_stream_gets_exactly_the_later_events(jobs: Stub, sessions: sessionmaker[Session]) -> None:
    job_id = submit(jobs)
    jobs.CancelJob(J.CancelJobRequest(job_id=job_id, reason="enough"), timeout=5)
    history = watch(jobs, job_id)
    sequences = [e.sequence for e in history]
    # The job_events rows' ids: strictly increasing, every one sent.
    assert sequences == stored_ids(sessions, job_id) and sequences[0] > 0
    assert history[0].message == "submitted" and history[-1].state == job_pb2.JOB_STATE_CANCELLED

    for k, event in enumerate(history):
        resumed = watch(jobs, job_id, after=event.sequence)
        assert resumed == history[k + 1 :]  # the later events, as the full stream sent them
    # Resumed after its final event, an ended job's stream ends at once, empty.
    assert watch(jobs, job_id, after=history[-1].sequence) == []


def test_live_events_carry_their_sequence(jobs: Stub, sessions: sessionmaker[Session]) -> None:
    job_id = submit(jobs)
    stream = jobs.WatchJob(J.WatchJobRequest(job_id=job_id), timeout=10)
    first = next(stream)
    assert first.message == "submitted" and first.sequence > 0
    jobs.CancelJob(J.CancelJobRequest(job_id=job_id, reason="live"), timeout=5)
    live = list(stream)
    assert live[-1].state == job_pb2.JOB_STATE_CANCELLED
    assert [first.sequence, *(e.sequence for e in live)] == stored_ids(sessions, job_id)
    # A stream resumed after the first event gets what the live one did.
    assert watch(jobs, job_id, after=first.sequence) == live


def test_a_negative_resume_point_is_refused_naming_the_field(jobs: Stub) -> None:
    got = refusal(jobs.WatchJob, J.WatchJobRequest(job_id="", after_sequence=-1))
    assert_bad_request(got, [("job_id", "REQUIRED"), ("after_sequence", "OUT_OF_RANGE")])


def test_an_event_committed_after_a_later_id_of_another_job_is_not_skipped(
    jobs: Stub, sessions: sessionmaker[Session]
) -> None:
    """Ids are taken before commit: job A's event takes id x, job B's takes y > x and
    commits first. The hub has then read y; A's watcher must still get x."""
    a, b = submit(jobs), submit(jobs)
    stream_a = jobs.WatchJob(J.WatchJobRequest(job_id=a), timeout=20)
    stream_b = jobs.WatchJob(J.WatchJobRequest(job_id=b), timeout=20)
    assert next(stream_a).message == "submitted"  # both streams have read their past
    assert next(stream_b).message == "submitted"
    now = datetime.now(UTC)
    with sessions() as held:
        # The fleet tick writes these rows too: a wait on it fails the test, never hangs it.
        held.execute(text("SET LOCAL lock_timeout = '10s'"))
        set_job_state(held, held.get_one(models.Job, a), JobState.QUEUED, now, "held open")
        held.flush()  # x is taken; not committed
        with sessions() as other, other.begin():
            other.execute(text("SET LOCAL lock_timeout = '10s'"))
            set_job_state(other, other.get_one(models.Job, b), JobState.QUEUED, now, "committed first")
        later = until_message(stream_b, "committed first")  # the hub has read y
        held.commit()
    earlier = until_message(stream_a, "held open")
    assert 0 < earlier.sequence < later.sequence
    stream_a.cancel()
    stream_b.cancel()


def test_a_jobs_events_commit_in_sequence_order(sessions: sessionmaker[Session], jobs: Stub) -> None:
    """What the resume point relies on: a writer of a job's event takes the job's row lock
    before its event takes an id, so one job's ids commit in increasing order. Here the
    second writer starts first and must wait: its id comes after the holder's."""
    job_id = submit(jobs)
    now = datetime.now(UTC)
    with sessions() as holder:
        job = holder.get_one(models.Job, job_id, with_for_update=True)
        pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()

        def second_writer() -> None:
            with sessions() as s, s.begin():
                set_job_state(s, s.get_one(models.Job, job_id), JobState.QUEUED, now, "second")

        writer = threading.Thread(target=second_writer)
        writer.start()
        give_up = time.monotonic() + 10  # a bound against a hang, not a timed assertion
        with sessions() as observer:
            while not observer.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"),
                {"pid": pid},
            ).scalar_one():
                observer.rollback()  # a fresh snapshot of the activity view each look
                assert time.monotonic() < give_up, "the second writer never waited for the row lock"
        set_job_state(holder, job, JobState.QUEUED, now, "first")
        holder.commit()
    writer.join(timeout=10)
    assert not writer.is_alive()
    with sessions() as s:
        E = models.JobEvent
        rows = s.execute(
            select(E.message, E.id).where(E.job_id == job_id, E.message.in_(["first", "second"]))
        )
        ids = {message: event_id for message, event_id in rows}
    assert ids["first"] < ids["second"]
    # And a watch resumed after the holder's event gets the waiter's.
    resumed = jobs.WatchJob(J.WatchJobRequest(job_id=job_id, after_sequence=ids["first"]), timeout=10)
    assert until_message(resumed, "second").sequence == ids["second"]
    resumed.cancel()
