"""A pool's warm capacity and its idle release, from tables: the idle clock, which
machines are pinned warm, the top-up to the warm target within the ceilings, and the
release watchdog's decision with each reason it refuses."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from gpufleet.scheduler.tick.decide import decide
from gpufleet.scheduler.tick.model import (
    AttemptView,
    CreateMachine,
    FleetSnapshot,
    PoolClock,
    PoolView,
    StartMachine,
)
from gpufleet.scheduler.watchdogs import pool_idle
from gpufleet.scheduler.watchdogs.pool_idle import PoolIdle
from tests.unit.scheduler.test_decide import NOW, POLICY, job, machine, snapshot


def warm(snap: FleetSnapshot, target: int = 1, **pool: object) -> FleetSnapshot:
    view = replace(snap.pools["l4"], warm_target=target, **pool)  # type: ignore[arg-type]
    return replace(snap, pools={"l4": view})


def live(mid: str) -> AttemptView:
    return AttemptView(
        id=f"a-{mid}",
        job_id=f"j-{mid}",
        machine_id=mid,
        state="RUNNING",
        started_at=NOW,
        lease_expires_at=NOW + timedelta(minutes=1),
        slots=1,
        time_limit_s=3600,
    )


# -- the idle clock -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queued", "attempts", "idle_since", "released", "clocks"),
    [
        # No work, clock not running: it starts.
        ([], [], None, False, [PoolClock("l4", busy=False)]),
        # No work, clock running: nothing to write.
        ([], [], NOW - timedelta(minutes=5), False, []),
        # Queued work stops the clock; so does a live attempt.
        (["j"], [], NOW - timedelta(minutes=5), False, [PoolClock("l4", busy=True)]),
        ([], ["m"], NOW - timedelta(minutes=5), False, [PoolClock("l4", busy=True)]),
        # Work back after a release: the clock stops and the warm capacity is held again.
        (["j"], [], None, True, [PoolClock("l4", busy=True)]),
        # Busy and not idle: nothing to write.
        (["j"], [], None, False, []),
    ],
)
def test_the_idle_clock(
    queued: list[str], attempts: list[str], idle_since: object, released: bool, clocks: list[PoolClock]
) -> None:
    snap = snapshot(
        queued=[job(j) for j in queued],
        machines=[machine("m", busy=frozenset({0}) if attempts else frozenset())],
        attempts=[live(m) for m in attempts],
    )
    snap = warm(snap, idle_since=idle_since, warm_released=released)
    assert decide(snap, POLICY).pool_clocks == clocks


# -- the warm pins and the top-up -------------------------------------------------------------


def test_the_cheapest_running_machines_of_the_pool_are_pinned_warm() -> None:
    machines = [
        machine("dear", price=900_000),
        machine("cheap", price=400_000),
        machine("registered", price=100_000, origin="REGISTERED"),
        machine("lost", price=100_000, lost=True),
        machine("stopped", state="STOPPED", price=100_000),
        machine("was-pinned", price=950_000, warm_held=True),
    ]
    plan = decide(warm(snapshot(machines=machines), target=2), POLICY)
    pins = {p.machine_id: p.held for p in plan.warm_pins}
    assert pins == {"cheap": True, "dear": True, "was-pinned": False}
    assert plan.scale == []  # two running: the target is met


def test_a_released_pool_pins_nothing_and_keeps_nothing_warm() -> None:
    machines = [machine("m", warm_held=True)]
    snap = warm(
        snapshot(machines=machines), target=2, warm_released=True, idle_since=NOW - timedelta(hours=1)
    )
    plan = decide(snap, POLICY)
    assert [(p.machine_id, p.held) for p in plan.warm_pins] == [("m", False)]
    assert plan.scale == []


def test_a_pool_short_of_its_warm_target_starts_its_cheapest_stopped_machine_then_creates() -> None:
    machines = [machine("stopped", state="STOPPED", price=300_000)]
    plan = decide(warm(snapshot(machines=machines), target=2), POLICY)
    assert plan.scale == [StartMachine("stopped"), CreateMachine("cheap", "l4")]


def test_the_warm_top_up_stays_within_the_ceilings() -> None:
    plan = decide(warm(snapshot(pool_max=1), target=3), POLICY)
    assert plan.scale == [CreateMachine("cheap", "l4")]
    plan = decide(warm(snapshot(machines=[machine("m")]), target=3), replace(POLICY, max_running_machines=1))
    assert plan.scale == []


def test_machines_started_for_work_count_toward_the_warm_target() -> None:
    plan = decide(warm(snapshot(queued=[job("j")]), target=1), POLICY)
    assert plan.scale == [CreateMachine("cheap", "l4")]


def test_no_warm_target_means_nothing_kept() -> None:
    plan = decide(snapshot(machines=[machine("m")]), POLICY)
    assert plan.warm_pins == [] and plan.scale == []


# -- the release watchdog -------------------------------------------------------------------


def pool(**kw: object) -> PoolIdle:
    base = PoolIdle(
        "l4",
        warm_target=1,
        idle_since=NOW - timedelta(minutes=31),
        idle_release_after_s=1800,
        warm_released=False,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("p", "released", "refusal"),
    [
        (pool(), True, None),
        (pool(idle_since=NOW - timedelta(seconds=1800)), True, None),
        # One second inside its idle time: not yet.
        (pool(idle_since=NOW - timedelta(seconds=1799)), False, "NOT_IDLE_LONG_ENOUGH"),
        (pool(idle_since=None), False, "HAS_WORK"),
        (pool(warm_released=True), False, "ALREADY_RELEASED"),
        (pool(warm_target=0), False, "NO_WARM_TARGET"),
        # Each pool by its own idle time.
        (pool(idle_release_after_s=3600), False, "NOT_IDLE_LONG_ENOUGH"),
    ],
)
def test_pool_idle_release_decide(p: PoolIdle, released: bool, refusal: str | None) -> None:
    decision = pool_idle.decide(NOW, [p])
    assert (decision.release == [p]) is released
    assert dict(decision.refusals) == ({refusal: 1} if refusal else {})


@pytest.mark.parametrize(
    "p",
    [
        pool(),
        pool(idle_since=NOW - timedelta(seconds=1799)),
        pool(idle_since=NOW),
        pool(idle_since=None),
        pool(warm_released=True),
        pool(warm_target=0),
        pool(idle_release_after_s=3600),
    ],
)
def test_the_release_is_due_exactly_when_the_decision_first_releases(p: PoolIdle) -> None:
    """``due_at`` is the watchdog's requeue-after: nothing changing, the pool is released at
    it and not a microsecond before; a pool it says is never due is never released."""
    due = pool_idle.due_at(p)
    if due is None:
        for later in (NOW, NOW + timedelta(days=30)):
            assert pool_idle.decide(later, [p]).release == []
        return
    assert pool_idle.decide(due, [p]).release == [p]
    assert pool_idle.decide(due - timedelta(microseconds=1), [p]).release == []


def test_pool_view_defaults_keep_nothing_warm() -> None:
    assert PoolView("p", 2, 4).warm_target == 0
