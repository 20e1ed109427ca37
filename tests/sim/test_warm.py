"""Warm capacity in a simulated month (issue #26's drift: the simulator ignored the tick's
pool clocks and warm pins and read every machine as unpinned, though auto-stop and
auto-destroy refuse a pinned one). The month now applies the tick's pool writes
(``warm.clock_values`` and the pins), runs the scheduler's pool idle release decision at
its cadence, and fails if the money chain ever takes a pinned machine."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.scheduler.tick.warm import LIVE
from gpufleet.sim.profile import PROFILES, SimConfig
from gpufleet.sim.report import summarize
from gpufleet.sim.world import Sim

DAYS, MACHINES, SEED = 2.0, 60, 3


def _month(warm: int) -> tuple[Sim, dict[str, Any]]:
    sim = Sim(
        SimConfig(days=DAYS, machines=MACHINES, seed=SEED, faults=PROFILES["default"], warm_target=warm),
        "nets",
    )
    sim.run()  # an invariant broken (a pinned machine stopped) raises here
    return sim, summarize(sim, 0.0)


@pytest.fixture(scope="module")
def months() -> dict[int, tuple[Sim, dict[str, Any]]]:
    return {warm: _month(warm) for warm in (0, 2)}


def test_pinned_machines_are_refused_by_the_money_chain_until_released(
    months: dict[int, tuple[Sim, dict[str, Any]]],
) -> None:
    cold, warm = months[0][1], months[2][1]
    assert warm["healthy_destroys"] == 0 and warm["jobs_lost"] == 0
    # The real auto-stop read pinned quiet machines and refused them, naming the gate ...
    assert warm["refusals"].get("auto_stop:WARM_CAPACITY", 0) > 0
    assert "auto_stop:WARM_CAPACITY" not in cold["refusals"]
    # ... and a pool idle for its idle time was released by the real decision, after which
    # the money chain stopped its quiet machines as any others.
    assert warm["decisions"].get("pool_idle_release", 0) >= 1
    assert warm["warm_target"] == 2
    # The pinned hours are counted as what they are.
    assert warm["idle_gpu_hours_by_cause"].get("warm capacity (pinned)", 0) > 0
    assert "warm capacity (pinned)" not in cold["idle_gpu_hours_by_cause"]


def test_warm_capacity_costs_idle_hours_and_buys_shorter_waits(
    months: dict[int, tuple[Sim, dict[str, Any]]],
) -> None:
    cold, warm = months[0][1], months[2][1]
    assert warm["idle_gpu_hours"] > cold["idle_gpu_hours"]
    assert warm["cost_usd"] > cold["cost_usd"]
    # A film (a whole machine) waits for a boot on a cold pool, rarely on a warm one.
    for plan in ("creator", "studio"):
        key = f"film/{plan}"
        assert warm["queue_wait"][key]["p50_s"] < cold["queue_wait"][key]["p50_s"], key


def test_every_pool_holds_its_warm_machines_while_it_has_work(
    months: dict[int, tuple[Sim, dict[str, Any]]],
) -> None:
    sim = months[2][0]
    # At the month's end each pool's view is what the tick and the watchdog wrote; a pool
    # holding its warm capacity has its target pinned among its running machines.
    for pool in sim.pools:
        view = sim.pool_views[pool][pool]
        pinned = [m for mid in sim.by_pool[pool] if (m := sim.machines[mid]).warm_held]
        if view.warm_released and view.idle_since is not None:
            assert pinned == [], pool
        else:
            assert len(pinned) <= view.warm_target, pool
            assert all(m.state in LIVE for m in pinned), pool
