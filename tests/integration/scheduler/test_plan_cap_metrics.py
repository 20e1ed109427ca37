"""Plan caps as an operator reads them, after real fleet ticks on PostgreSQL with a real agent
over gRPC and the real WorkerService (``metered_fleet``): a studio plan allows three GPU jobs
at once per workspace; its workspace queues five with room for six on the machines. The tick
starts three and holds two for the plan's cap (their recorded reason says so), and the
gauges say the same per plan tier — two held, one workspace at its cap, three running —
until the jobs finish or the cap is raised. The held count covers every queued job the cap
holds, not only the few a tick reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from gpufleet.common.catalog import Catalog, PlanSpec
from gpufleet.common.db import models
from gpufleet.common.metrics.catalog import (
    SCHEDULER_PLAN_CAP_HELD_JOBS,
    SCHEDULER_PLAN_CAP_RUNNING_JOBS,
    SCHEDULER_PLAN_CAP_WORKSPACES_AT_CAP,
    Metric,
)
from gpufleet.v1 import job_pb2
from tests.integration.scheduler.metered_fleet import MeteredFleet, catalogue, metered_fleet

CAP = 3
JOBS = CAP + 2
CAP_GAUGES = (
    SCHEDULER_PLAN_CAP_HELD_JOBS,
    SCHEDULER_PLAN_CAP_WORKSPACES_AT_CAP,
    SCHEDULER_PLAN_CAP_RUNNING_JOBS,
)


def capped_catalogue() -> Catalog:
    """metered_fleet's catalogue with the studio plan (tier 1) allowing ``CAP`` jobs at once;
    the free plan (tier 0) allows one."""
    plans = [PlanSpec(id="free", tier=0, max_gpu_jobs=1), PlanSpec(id="studio", tier=1, max_gpu_jobs=CAP)]
    return catalogue().model_copy(update={"plans": plans})


@pytest.fixture
def fleet(pg_url: str) -> Iterator[MeteredFleet]:
    with metered_fleet(pg_url, capped_catalogue()) as fleet:
        yield fleet


def by_tier(fleet: MeteredFleet, metric: Metric) -> dict[str, float]:
    return {dict(labels)["plan_tier"]: value for labels, value in fleet.probe.series(metric.name).items()}


def caps(fleet: MeteredFleet) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """(held, workspaces at cap, running) by plan tier."""
    held, at_cap, running = (by_tier(fleet, m) for m in CAP_GAUGES)
    return held, at_cap, running


def pending_reasons(fleet: MeteredFleet) -> dict[str, str | None]:
    with fleet.sessions() as s:
        rows = s.execute(select(models.Job.id, models.Job.pending_reason).where(models.Job.state == "QUEUED"))
        return {job_id: reason for job_id, reason in rows.all()}


def queue_studio_jobs(fleet: MeteredFleet) -> list[str]:
    for _ in range(3):  # room for six
        fleet.machine()
    return [fleet.job(f"studio-{n}", waited_s=60 - n) for n in range(JOBS)]


def test_the_cap_holds_two_of_five_jobs_until_the_first_three_finish(fleet: MeteredFleet) -> None:
    jobs = queue_studio_jobs(fleet)

    report = fleet.tick()

    assert report.actions["assign"] == CAP
    # The tick's own word for the two left: the plan's cap.
    assert pending_reasons(fleet) == dict.fromkeys(jobs[CAP:], "PLAN_CONCURRENCY_LIMIT")
    held, at_cap, running = caps(fleet)
    print(f"after the first tick: held {held}, at cap {at_cap}, running {running}")
    assert held == {"0": 0, "1": 2}
    assert at_cap == {"0": 0, "1": 1}
    assert running == {"0": 0, "1": CAP}

    # The three finish; the next tick starts the two held ones, and the cap holds nothing.
    for job_id in jobs[:CAP]:
        (attempt,) = fleet.attempts(job_id)
        fleet.complete(attempt, job_pb2.ATTEMPT_STATE_SUCCEEDED)
    assert fleet.tick(after_s=15).actions["assign"] == 2
    held, at_cap, running = caps(fleet)
    print(f"after the three finished: held {held}, at cap {at_cap}, running {running}")
    assert held == {"0": 0, "1": 0}
    assert at_cap == {"0": 0, "1": 0}
    assert running == {"0": 0, "1": 2}

    # No tick since (deposed, or stuck): the gauges leave the figures to the leader.
    fleet.clock.advance(timedelta(seconds=3 * fleet.settings.tick_s + 1))
    assert caps(fleet) == ({}, {}, {})


def test_raising_the_cap_lets_the_held_jobs_start(fleet: MeteredFleet) -> None:
    queue_studio_jobs(fleet)
    fleet.tick()
    assert caps(fleet)[:2] == ({"0": 0, "1": 2}, {"0": 0, "1": 1})

    with fleet.sessions() as s, s.begin():
        s.execute(update(models.Plan).where(models.Plan.id == "studio").values(max_gpu_jobs=10))
    assert fleet.tick(after_s=15).actions["assign"] == 2

    held, at_cap, running = caps(fleet)
    print(f"after the cap was raised to 10: held {held}, at cap {at_cap}, running {running}")
    assert held == {"0": 0, "1": 0}
    assert at_cap == {"0": 0, "1": 0}
    assert running == {"0": 0, "1": JOBS}


def test_every_job_the_cap_holds_is_counted_not_only_those_a_tick_reads(fleet: MeteredFleet) -> None:
    """The free plan runs one job at a time, so a tick reads one queued job of its workspace
    (and the others once, to record their reason): the gauge counts all six it holds, tick
    after tick, and none that waits for another reason (a back-off, a paused workspace)."""
    machine = fleet.machine(slots=1)
    fleet.running("free-running", machine, 0, workspace="ws-free")
    for n in range(6):
        fleet.job(f"free-{n}", workspace="ws-free", waited_s=60 - n)
    fleet.job("free-backing-off", workspace="ws-free", not_before=fleet.clock.now() + timedelta(hours=1))
    with fleet.sessions() as s, s.begin():
        s.add(models.Workspace(id="ws-paused", plan_id="free", active=False))
    fleet.job("paused-1", workspace="ws-paused")

    for after_s in (0, 15, 15):
        fleet.tick(after_s=after_s)
        held, at_cap, running = caps(fleet)
        assert held == {"0": 6, "1": 0}
        assert at_cap == {"0": 1, "1": 0}
        assert running == {"0": 1, "1": 0}
    print(f"a free workspace at its cap of 1: held {held}, at cap {at_cap}, running {running}")
    assert list(pending_reasons(fleet).values()).count("PLAN_CONCURRENCY_LIMIT") == 6
