"""The scheduler's request watchdogs that end a job, as an operator counts them on a real
PostgreSQL: a queued job failed by the queue-wait timeout or the no-consumer detector is one
``gpufleet.jobs.finished`` (FAILED, by kind) once its transaction has committed, counted
once however often the watchdog runs, and not at all when its write was refused."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import Catalog, KindSpec, OfferingSpec, PlanSpec, PoolSpec, WorkspaceSpec
from gpufleet.common.clock import ManualClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.errors import Fenced
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.metrics.catalog import ATTEMPTS_LOST, JOBS_FINISHED, JOBS_RETRIED
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.tick.served import ServedOfferings
from gpufleet.scheduler.watchdogs.no_consumer import NoConsumerDetector
from gpufleet.scheduler.watchdogs.queue_wait import QueueWaitTimeout
from tests.support.fleet_rows import add_job
from tests.support.metrics import MetricsProbe

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)

CATALOGUE = Catalog(
    plans=[PlanSpec(id="studio", tier=1, max_gpu_jobs=20)],
    workspaces=[WorkspaceSpec(id="ws", plan="studio")],
    kinds=[
        KindSpec(id="short", slots=1, time_limit_s=600.0, queue_wait_deadline_s=DAY.total_seconds()),
        KindSpec(id="film", slots=0, time_limit_s=9 * 3600.0, queue_wait_deadline_s=2 * DAY.total_seconds()),
    ],
    pools=[
        PoolSpec(
            id="aws-pool",
            slots_per_machine=2,
            max_machines=4,
            offerings=[
                OfferingSpec(
                    id="aws-l4",
                    provider="AWS",
                    region="us-east-1",
                    zone="us-east-1a",
                    instance_type="l4",
                    slots=2,
                    hourly_price_micros=800_000,
                )
            ],
        )
    ],
)


class SimOnly:
    """The provisioner's answer to ListOfferings when it runs only the sim driver."""

    def served_offering_ids(self) -> set[str]:
        return {"sim-l4"}


@dataclass
class Store:
    sessions: sessionmaker[Session]
    clock: ManualClock
    lease: LeaderLease
    probe: MetricsProbe

    def job(self, job_id: str, kind: str = "short", waited: timedelta = timedelta(0)) -> str:
        at = NOW - waited
        return add_job(
            self.sessions, at, id=job_id, workspace_id="ws", pool_id="aws-pool", kind_id=kind, created_at=at
        )

    def state(self, job_id: str) -> str:
        with self.sessions() as s:
            return s.get_one(models.Job, job_id).state

    def finished(self) -> dict[tuple[str, str], float]:
        return {
            (dict(k)["kind"], dict(k)["outcome"]): v for k, v in self.probe.series(JOBS_FINISHED.name).items()
        }


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        sync_catalog(s, CATALOGUE)
    clock = ManualClock(NOW)
    lease = LeaderLease("scheduler", "a", clock, sessions, ttl_s=60)
    assert lease.try_acquire()
    probe = MetricsProbe()
    yield Store(sessions, clock, lease, probe)
    probe.close()
    engine.dispose()


def test_a_queue_wait_timeout_counts_its_job_finished_failed_once(store: Store) -> None:
    store.job("late", waited=DAY + timedelta(seconds=1))
    store.job("film-late", kind="film", waited=2 * DAY + timedelta(seconds=1))
    store.job("inside", waited=DAY - timedelta(seconds=1))
    store.job("film-inside", kind="film", waited=DAY + timedelta(seconds=1))  # a film waits two days
    net = QueueWaitTimeout(store.sessions, store.lease, instruments=store.probe.instruments)

    assert net.run(NOW).actions == {"failed": 2}
    assert store.finished() == {("short", "FAILED"): 1, ("film", "FAILED"): 1}
    # Its next run finds them failed already: nothing new ended, nothing more counted.
    assert not net.run(NOW + timedelta(seconds=1)).actions["failed"]
    assert store.finished() == {("short", "FAILED"): 1, ("film", "FAILED"): 1}
    assert [store.state(j) for j in ("late", "film-late", "inside", "film-inside")] == [
        "FAILED",
        "FAILED",
        "QUEUED",
        "QUEUED",
    ]
    # A queued job failed is no attempt lost and no retry.
    assert store.probe.series(ATTEMPTS_LOST.name) == {} and store.probe.series(JOBS_RETRIED.name) == {}


def test_a_queue_wait_timeout_refused_by_the_fence_counts_nothing(store: Store) -> None:
    store.job("late", waited=DAY + timedelta(seconds=1))
    net = QueueWaitTimeout(store.sessions, store.lease, instruments=store.probe.instruments)
    # This replica was paused past its term; another took the lease meanwhile.
    store.clock.advance(timedelta(seconds=61))
    other = LeaderLease("scheduler", "b", store.clock, store.sessions, ttl_s=60)
    assert other.try_acquire()

    with pytest.raises(Fenced):
        net.run(store.clock.now())
    assert store.state("late") == "QUEUED"
    assert store.finished() == {}


def test_a_job_nothing_can_serve_counts_finished_failed_once(store: Store) -> None:
    store.job("aws-1")
    store.job("aws-2", kind="film")
    detector = NoConsumerDetector(
        store.sessions, store.lease, SimOnly(), ServedOfferings(), 4, instruments=store.probe.instruments
    )

    assert detector.run(NOW).actions == {"failed": 2}
    detector.run(NOW + timedelta(minutes=1))
    assert store.finished() == {("short", "FAILED"): 1, ("film", "FAILED"): 1}
    assert store.state("aws-1") == "FAILED"
