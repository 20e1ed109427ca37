"""The scheduler's request-level watchdogs against a real store (PostgreSQL and SQLite):
what each one writes when it acts — the job, its event, the ledger row, the incident —
and what it leaves alone, run by the scheduler's own Ticker so they show in
``gpufleet watchdogs``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import load_catalog
from gpufleet.common.clock import ManualClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import PeriodicTask, Ticker
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.watchdogs.paid_wait import PaidWaitIncident, PaidWaitPolicy
from gpufleet.scheduler.watchdogs.queue_wait import QueueWaitTimeout
from gpufleet.scheduler.watchdogs.stuck_dispatch import StuckDispatchPolicy, StuckDispatchReset
from tests.support.fleet_rows import add_job, add_machine

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@dataclass
class Store:
    sessions: sessionmaker[Session]
    clock: ManualClock
    lease: LeaderLease

    def job(self, state: str = "QUEUED", **values: object) -> str:
        return add_job(self.sessions, NOW, state=state, **values)

    def get(self, job_id: str) -> models.Job:
        with self.sessions() as s:
            return s.get_one(models.Job, job_id)

    def ledger(self, failure_class: str) -> list[models.Failure]:
        with self.sessions() as s:
            return list(
                s.execute(
                    select(models.Failure).where(models.Failure.failure_class == failure_class)
                ).scalars()
            )

    def incidents(self) -> list[models.Incident]:
        with self.sessions() as s:
            return list(s.execute(select(models.Incident).order_by(models.Incident.id)).scalars())


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        sync_catalog(s, load_catalog(None))
    clock = ManualClock(NOW)
    lease = LeaderLease("scheduler", "test", clock, sessions, ttl_s=3600)
    assert lease.try_acquire()
    yield Store(sessions, clock, lease)
    engine.dispose()


def test_a_queued_job_past_its_kinds_deadline_fails_uncharged_and_one_inside_waits(store: Store) -> None:
    # The default catalogue's kinds wait a day at most.
    late = store.job(created_at=NOW - timedelta(days=1, seconds=1))
    inside = store.job(created_at=NOW - timedelta(days=1) + timedelta(seconds=1))
    # Requeued after an attempt an hour ago: its wait began then, not at submission.
    requeued = store.job(
        created_at=NOW - timedelta(days=3), updated_at=NOW - timedelta(hours=1), attempt_count=1
    )
    running = store.job("RUNNING", created_at=NOW - timedelta(days=3))
    report = QueueWaitTimeout(store.sessions, store.lease).run(NOW)
    assert report.actions == {"failed": 1}
    failed = store.get(late)
    assert (failed.state, failed.charge_micros, failed.ended_at) == ("FAILED", 0, NOW)
    assert "queue-wait deadline (86400 s" in failed.status_message and "not charged" in failed.status_message
    assert [store.get(j).state for j in (inside, requeued, running)] == ["QUEUED", "QUEUED", "RUNNING"]
    [row] = store.ledger("queue_wait_timeout")
    assert (row.job_id, row.detector, row.outcome) == (late, "queue_wait_timeout", "FAIL_JOB")
    with store.sessions() as s:
        events = (
            s.execute(select(models.JobEvent.state).where(models.JobEvent.job_id == late)).scalars().all()
        )
    assert events == ["FAILED"]


def test_a_paid_job_waiting_half_an_hour_opens_one_incident_resolved_when_it_starts(store: Store) -> None:
    net = PaidWaitIncident(store.sessions, store.lease, PaidWaitPolicy())
    paid = store.job(created_at=NOW - timedelta(minutes=31))
    recent = store.job(created_at=NOW - timedelta(minutes=29))
    report = net.run(NOW)
    assert report.actions["opened"] == 1 and report.refusals["NOT_WAITING_LONG_ENOUGH"] == 1
    [incident] = store.incidents()
    assert (incident.job_id, incident.state, incident.failure_class) == (paid, "OPEN", "paid_wait")
    assert "acme-studio" in incident.summary and "31 min" in incident.summary
    # Once per job: later runs open none more for it (the other job passes 30 min and opens its own).
    net.run(NOW + timedelta(minutes=5))
    assert [i.job_id for i in store.incidents()] == [paid, recent]
    assert store.get(paid).paid_wait_incident
    # It starts: the incident is resolved on the next run; the other job still waits.
    with store.sessions() as s, s.begin():
        s.get_one(models.Job, paid).state = "RUNNING"
    assert net.run(NOW + timedelta(minutes=6)).actions["resolved"] == 1
    first, second = store.incidents()
    assert (first.state, first.resolved_at) == ("RESOLVED", NOW + timedelta(minutes=6))
    assert (second.state, second.resolved_at) == ("OPEN", None)  # still waiting
    assert [r.job_id for r in store.ledger("paid_wait")] == [paid, recent]


def test_a_job_left_dispatching_with_nothing_starting_goes_back_without_spending_a_retry(
    store: Store,
) -> None:
    net = StuckDispatchReset(store.sessions, store.lease, StuckDispatchPolicy())
    stuck = store.job(
        "DISPATCHING",
        updated_at=NOW - timedelta(minutes=6),
        attempt_count=1,
        lost_retries_used=1,
        failure_retries_used=1,
        not_before=NOW + timedelta(hours=1),
    )
    fresh = store.job("DISPATCHING", updated_at=NOW - timedelta(minutes=4))
    report = net.run(NOW)
    assert report.actions == {"reset": 1} and report.refusals["INSIDE_BOUND"] == 1
    job = store.get(stuck)
    assert (job.state, job.not_before, job.lost_retries_used, job.failure_retries_used) == (
        "QUEUED",
        None,
        1,
        1,
    )
    assert "no retry spent" in job.status_message
    assert store.get(fresh).state == "DISPATCHING"
    [row] = store.ledger("dispatch_stuck")
    assert (row.job_id, row.outcome) == (stuck, "NOTHING")


def test_a_dispatching_job_whose_attempt_still_starts_is_left_to_the_dispatch_deadline(store: Store) -> None:
    job_id = store.job("DISPATCHING", updated_at=NOW - timedelta(hours=1))
    add_machine(store.sessions, NOW, id="m1")
    with store.sessions() as s, s.begin():
        s.add(
            models.Attempt(
                id="a1",
                job_id=job_id,
                machine_id="m1",
                slot=0,
                slots=1,
                state="STARTING",
                started_at=NOW,
                lease_expires_at=NOW + timedelta(minutes=2),
            )
        )
    report = StuckDispatchReset(store.sessions, store.lease, StuckDispatchPolicy()).run(NOW)
    assert report.actions == {} and report.refusals["ATTEMPT_IN_FLIGHT"] == 1
    assert store.get(job_id).state == "DISPATCHING"


def test_the_watchdogs_run_as_ticker_tasks_with_their_own_counters(store: Store) -> None:
    store.job(created_at=NOW - timedelta(days=2))
    ticker = Ticker(
        "scheduler",
        store.clock,
        store.sessions,
        store.lease,
        [
            PeriodicTask("queue_wait_timeout", 60, QueueWaitTimeout(store.sessions, store.lease).run),
            PeriodicTask(
                "paid_wait_incident", 60, PaidWaitIncident(store.sessions, store.lease, PaidWaitPolicy()).run
            ),
        ],
        renew_s=5,
    )
    ticker.run_due()
    with store.sessions() as s:
        stats = {w.name: w for w in s.execute(select(models.WatchdogStat)).scalars()}
    assert stats["queue_wait_timeout"].actions == {"failed": 1}
    assert (stats["queue_wait_timeout"].cadence_s, stats["queue_wait_timeout"].service) == (60, "scheduler")
    assert stats["paid_wait_incident"].runs == 1
