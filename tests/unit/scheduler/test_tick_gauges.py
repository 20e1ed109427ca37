"""The fleet tick's money, capacity and queue metrics from what it holds: the GPU-seconds
booked from snapshot to snapshot, the gauges read from the last snapshot only while it is
fresh, and a start's queue wait and dispatch measured from what its commit carried."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from gpufleet.common.clock import ManualClock
from gpufleet.common.metrics.catalog import (
    FLEET_FILM_MACHINES,
    FLEET_GPU_BILLED,
    FLEET_GPU_IDLE,
    FLEET_SLOTS,
    FLEET_SPEND_RATE,
    FLEET_WARM_MACHINES,
    JOBS_STARTED,
    SCHEDULER_DISPATCH_DURATION,
    SCHEDULER_FAIR_SHARE_USAGE,
    SCHEDULER_PLAN_CAP_HELD_JOBS,
    SCHEDULER_PLAN_CAP_RUNNING_JOBS,
    SCHEDULER_PLAN_CAP_WORKSPACES_AT_CAP,
    SCHEDULER_QUEUE_JOBS,
    SCHEDULER_QUEUE_WAIT,
)
from gpufleet.scheduler.tick.metrics import Assigned, TickMetrics
from gpufleet.scheduler.tick.plan_caps import PlanCapFigures
from tests.support.metrics import MetricsProbe
from tests.unit.scheduler.fleet_views import NOW, machine, running_on, snapshot

TICK_S = 5.0
GAUGES = (
    FLEET_SPEND_RATE,
    FLEET_SLOTS,
    FLEET_FILM_MACHINES,
    FLEET_WARM_MACHINES,
    SCHEDULER_FAIR_SHARE_USAGE,
    SCHEDULER_QUEUE_JOBS,
    SCHEDULER_PLAN_CAP_HELD_JOBS,
    SCHEDULER_PLAN_CAP_WORKSPACES_AT_CAP,
    SCHEDULER_PLAN_CAP_RUNNING_JOBS,
)


@pytest.fixture
def probe() -> Iterator[MetricsProbe]:
    probe = MetricsProbe()
    yield probe
    probe.close()


def test_gpu_seconds_are_booked_per_tick_of_one_leadership(probe: MetricsProbe) -> None:
    clock = ManualClock(NOW)
    metrics = TickMetrics(probe.instruments, clock, fresh_s=3 * TICK_S)
    fleet = [machine("busy", busy_slots=frozenset({0})), machine("quiet", gpu_count=2)]
    billed = {"provider": "GCP", "pool": "l4"}

    metrics.saw(snapshot(fleet, [running_on("busy")]), epoch=7)
    assert probe.series(FLEET_GPU_BILLED.name) == {}  # the leadership's first tick
    clock.advance(timedelta(seconds=10))
    metrics.saw(snapshot(fleet, [running_on("busy")], now=clock.now()), epoch=7)
    assert probe.value(FLEET_GPU_BILLED.name, **billed) == 30.0  # 3 GPUs x 10 s
    assert probe.value(FLEET_GPU_IDLE.name, **billed) == 20.0  # the quiet machine's 2 GPUs

    clock.advance(timedelta(seconds=10))  # the busy machine's job ended
    metrics.saw(snapshot(fleet, now=clock.now()), epoch=7)
    assert probe.value(FLEET_GPU_BILLED.name, **billed) == 60.0
    assert probe.value(FLEET_GPU_IDLE.name, **billed) == 50.0
    metrics.close()


def test_the_gauges_report_the_last_snapshot_only_while_it_is_fresh(probe: MetricsProbe) -> None:
    clock = ManualClock(NOW)
    metrics = TickMetrics(probe.instruments, clock, fresh_s=3 * TICK_S)
    assert all(probe.series(g.name) == {} for g in GAUGES)  # nothing seen yet

    fleet = [
        machine("a", busy_slots=frozenset({0}), warm_held=True),
        machine("b", "DRAINING", earmarked_for="film-1", busy_slots=frozenset({0, 1})),
    ]
    metrics.saw(
        snapshot(fleet, workspace_tiers={"w": 1}, usage_per_workspace={"w": 900.0}),
        epoch=1,
    )
    metrics.counted_queue(
        clock.now(),
        {("short", "1"): 12, ("film", "1"): 0},
        PlanCapFigures(held={"0": 0, "1": 9}, at_cap={"0": 0, "1": 1}, running={"0": 0, "1": 3}),
    )
    assert probe.value(FLEET_SPEND_RATE.name, provider="GCP", pool="l4") == pytest.approx(2.5)
    assert probe.value(FLEET_SLOTS.name, pool="l4", slot_state="busy") == 1
    assert probe.value(FLEET_SLOTS.name, pool="l4", slot_state="free") == 3
    assert probe.value(FLEET_FILM_MACHINES.name, pool="l4", film_state="draining") == 1
    assert probe.value(FLEET_WARM_MACHINES.name, pool="l4") == 1
    assert probe.value(SCHEDULER_FAIR_SHARE_USAGE.name, plan_tier="1") == 900.0
    assert probe.series(SCHEDULER_QUEUE_JOBS.name) == {
        (("kind", "short"), ("plan_tier", "1")): 12,
        (("kind", "film"), ("plan_tier", "1")): 0,
    }
    assert probe.series(SCHEDULER_PLAN_CAP_HELD_JOBS.name) == {
        (("plan_tier", "0"),): 0,
        (("plan_tier", "1"),): 9,
    }
    assert probe.value(SCHEDULER_PLAN_CAP_WORKSPACES_AT_CAP.name, plan_tier="1") == 1
    assert probe.value(SCHEDULER_PLAN_CAP_RUNNING_JOBS.name, plan_tier="1") == 3

    clock.advance(timedelta(seconds=3 * TICK_S + 1))  # no tick since: deposed, or stuck
    assert all(probe.series(g.name) == {} for g in GAUGES)
    metrics.close()


def test_a_start_records_its_wait_from_the_queue_and_its_dispatch_from_the_commit(
    probe: MetricsProbe,
) -> None:
    metrics = TickMetrics(probe.instruments, ManualClock(NOW), fresh_s=3 * TICK_S)
    assigned_at = NOW - timedelta(seconds=2)
    metrics.started(
        [
            Assigned("short", assigned_at, plan_tier="1", queued_since=NOW - timedelta(seconds=100)),
            Assigned("short", assigned_at, plan_tier="0", queued_since=NOW - timedelta(seconds=40)),
            # Re-dispatched by a later leader: its wait is unknown, its dispatch is not.
            Assigned("film", NOW - timedelta(seconds=20)),
        ],
        NOW,
    )
    assert probe.series(JOBS_STARTED.name) == {(("kind", "short"),): 2, (("kind", "film"),): 1}
    waits = probe.points(SCHEDULER_QUEUE_WAIT.name)
    assert {k: (p.count, p.sum) for k, p in waits.items()} == {
        (("kind", "short"), ("plan_tier", "1")): (1, 100.0),
        (("kind", "short"), ("plan_tier", "0")): (1, 40.0),
    }
    (dispatch,) = probe.points(SCHEDULER_DISPATCH_DURATION.name).values()
    assert (dispatch.count, dispatch.sum) == (3, 24.0)
    metrics.close()
