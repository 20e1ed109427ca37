"""The queue and the jobs as an operator reads them, after real fleet ticks on PostgreSQL,
real agents over gRPC and the real WorkerService and JobService (``metered_fleet``): how
long each start waited (from submission, or from its requeue) and how long its dispatch
took, what finished and how, what was retried and why, what was lost; the queue's depth by
kind and plan tier (all of it, not the part a tick reads) and fair-share usage by tier.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from gpufleet.common.db import models
from gpufleet.common.metrics.catalog import (
    ATTEMPTS_LOST,
    JOBS_FINISHED,
    JOBS_RETRIED,
    JOBS_STARTED,
    SCHEDULER_DISPATCH_DURATION,
    SCHEDULER_FAIR_SHARE_USAGE,
    SCHEDULER_QUEUE_JOBS,
    SCHEDULER_QUEUE_WAIT,
)
from gpufleet.v1 import job_pb2
from tests.integration.scheduler.metered_fleet import NOWHERE, MeteredFleet, metered_fleet
from tests.support.metrics import MetricsProbe


@pytest.fixture
def fleet(pg_url: str) -> Iterator[MeteredFleet]:
    with metered_fleet(pg_url) as fleet:
        yield fleet


def waits(probe: MetricsProbe) -> dict[tuple[str, str], tuple[int, float]]:
    """(kind, plan tier) -> (starts, seconds waited in all)."""
    return {
        (dict(k)["kind"], dict(k)["plan_tier"]): (p.count, p.sum)
        for k, p in probe.points(SCHEDULER_QUEUE_WAIT.name).items()
    }


def test_a_start_waited_from_submission_or_requeue_and_its_dispatch_from_the_commit(
    fleet: MeteredFleet,
) -> None:
    fleet.machine()
    fleet.job("studio-1", workspace="ws-studio", waited_s=100)
    fleet.job("free-1", workspace="ws-free", waited_s=40)
    # The agent holds StartJob for two seconds after the assignment's commit.
    fleet.agent.hang()
    tick = fleet.leader()
    assert tick.run(fleet.clock.now()).actions["assign"] == 2
    fleet.clock.advance(timedelta(seconds=2))
    fleet.agent.release()
    assert tick.settle(30).actions["dispatched"] == 2
    probe = fleet.probe
    assert probe.series(JOBS_STARTED.name) == {(("kind", "short"),): 2}
    assert waits(probe) == {("short", "1"): (1, 102.0), ("short", "0"): (1, 42.0)}
    (dispatch,) = probe.points(SCHEDULER_DISPATCH_DURATION.name).values()
    assert (dispatch.count, dispatch.sum) == (2, 4.0)

    # The studio job's attempt fails 28 s later: retried, back in the queue; its next wait
    # counts from the requeue, not from its submission two minutes before.
    fleet.clock.advance(timedelta(seconds=28))
    (first,) = fleet.attempts("studio-1")
    fleet.complete(first, job_pb2.ATTEMPT_STATE_FAILED)
    assert probe.series(JOBS_RETRIED.name) == {(("failure_class", "job_failed"), ("kind", "short")): 1}
    fleet.tick(after_s=15)  # past its 10 s back-off
    assert waits(probe)[("short", "1")] == (2, 102.0 + 15.0)

    # It succeeds (the worker repeats its report: counted once); the free job is cancelled.
    second = fleet.attempts("studio-1")[-1]
    fleet.complete(second, job_pb2.ATTEMPT_STATE_SUCCEEDED)
    fleet.complete(second, job_pb2.ATTEMPT_STATE_SUCCEEDED)
    fleet.cancel("free-1")
    fleet.cancel("free-1")  # a client retrying: the job ended once
    assert probe.series(JOBS_FINISHED.name) == {
        (("kind", "short"), ("outcome", "SUCCEEDED")): 1,
        (("kind", "short"), ("outcome", "CANCELLED")): 1,
    }
    assert probe.series(JOBS_STARTED.name) == {(("kind", "short"),): 3}
    assert probe.series(ATTEMPTS_LOST.name) == {}


def test_a_time_limit_finishes_its_job_and_a_lease_run_out_loses_the_attempt(fleet: MeteredFleet) -> None:
    fleet.machine()
    fleet.job("capped-1", kind="capped")
    fleet.job("short-1")
    fleet.tick()  # both start; no worker will renew their leases (90 s)
    fleet.tick(after_s=35)  # the capped kind's 30 s limit
    assert fleet.job_state("capped-1") == "TIMED_OUT"
    fleet.tick(after_s=60)  # the lease ran out: the machine stopped reporting for them
    assert fleet.job_state("short-1") == "QUEUED"
    probe = fleet.probe
    assert probe.series(JOBS_FINISHED.name) == {(("kind", "capped"), ("outcome", "TIMED_OUT")): 1}
    assert probe.series(ATTEMPTS_LOST.name) == {(("kind", "short"),): 1}
    assert probe.series(JOBS_RETRIED.name) == {(("failure_class", "lease_expired"), ("kind", "short")): 1}


def test_an_attempt_its_agent_would_not_start_is_retried_as_our_infra_error(fleet: MeteredFleet) -> None:
    fleet.machine(agent_address=NOWHERE)
    fleet.job("short-1")
    report = fleet.tick()
    assert report.actions["start_job_failed_agent_unreachable"] == 1
    assert fleet.job_state("short-1") == "QUEUED"
    probe = fleet.probe
    assert probe.series(JOBS_RETRIED.name) == {(("failure_class", "job_infra_error"), ("kind", "short")): 1}
    assert probe.series(JOBS_STARTED.name) == {} and probe.series(JOBS_FINISHED.name) == {}


def test_the_queue_by_kind_and_tier_counts_every_queued_job_and_fair_share_sums_tiers(pg_url: str) -> None:
    with metered_fleet(pg_url, max_running_machines=0) as fleet:
        now = fleet.clock.now()
        full = fleet.machine(slots=1)
        fleet.running("studio-running", full, 0, started_s_ago=100)
        # The free plan runs one job at a time, so a tick reads one of its queued jobs (the
        # oldest); the gauge counts all of them, and the job waiting out a back-off too.
        for n in range(3):
            fleet.job(f"free-{n}", workspace="ws-free", waited_s=10 * n)
        fleet.job("free-film", kind="film", workspace="ws-free")
        fleet.job("studio-1")
        fleet.job("studio-retry", not_before=now + timedelta(minutes=5), attempt_count=1)
        fleet.job("studio-capped", kind="capped")
        # The free workspace used 500 slot-seconds in the window: an attempt ended a minute ago.
        fleet.job("free-done", workspace="ws-free", state="SUCCEEDED")
        with fleet.sessions() as s, s.begin():
            s.add(
                models.Attempt(
                    id="free-done-a1",
                    job_id="free-done",
                    machine_id=full,
                    slot=0,
                    state="SUCCEEDED",
                    started_at=now - timedelta(minutes=10),
                    ended_at=now - timedelta(minutes=1),
                    lease_expires_at=now,
                    slot_seconds=500.0,
                )
            )
        fleet.tick()
        probe = fleet.probe
        assert probe.series(SCHEDULER_QUEUE_JOBS.name) == {
            (("kind", "short"), ("plan_tier", "0")): 3,
            (("kind", "film"), ("plan_tier", "0")): 1,
            (("kind", "capped"), ("plan_tier", "0")): 0,
            (("kind", "short"), ("plan_tier", "1")): 2,
            (("kind", "capped"), ("plan_tier", "1")): 1,
            (("kind", "film"), ("plan_tier", "1")): 0,
        }
        # The studio's running job has used 100 slot-seconds so far.
        assert probe.series(SCHEDULER_FAIR_SHARE_USAGE.name) == {
            (("plan_tier", "0"),): 500.0,
            (("plan_tier", "1"),): 100.0,
        }
        fleet.clock.advance(timedelta(seconds=3 * fleet.settings.tick_s + 1))  # no tick since
        assert probe.series(SCHEDULER_QUEUE_JOBS.name) == {}
        assert probe.series(SCHEDULER_FAIR_SHARE_USAGE.name) == {}
