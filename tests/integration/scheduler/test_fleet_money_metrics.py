"""The fleet's money and capacity as an operator reads them, after real fleet ticks on
PostgreSQL (``metered_fleet``: the real ``FleetTick`` on a manual clock, real agents over
gRPC): GPU-seconds billed and idle booked tick to tick, the spend rate, slots, machines
held for films and held warm — and a new leader that books nothing for the time before
its first tick."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.common.metrics.catalog import (
    FLEET_FILM_MACHINES,
    FLEET_GPU_BILLED,
    FLEET_GPU_IDLE,
    FLEET_SLOTS,
    FLEET_SPEND_RATE,
    FLEET_WARM_MACHINES,
)
from tests.integration.scheduler.metered_fleet import MeteredFleet, catalogue, metered_fleet
from tests.support.metrics import MetricsProbe

L4 = {"provider": "SIM", "pool": "l4"}


@pytest.fixture
def fleet(pg_url: str) -> Iterator[MeteredFleet]:
    with metered_fleet(pg_url) as fleet:
        yield fleet


def gpu_seconds(probe: MetricsProbe) -> tuple[float, float]:
    return probe.value(FLEET_GPU_BILLED.name, **L4), probe.value(FLEET_GPU_IDLE.name, **L4)


def test_two_billing_machines_one_busy_over_two_ticks_ten_seconds_apart(fleet: MeteredFleet) -> None:
    busy, _quiet = fleet.machine(), fleet.machine()
    fleet.running("job-1", busy, slot=0)
    fleet.machine(state="STOPPED", intent="STOPPED")  # keeps its disk, bills no GPU
    probe = fleet.probe

    fleet.tick()
    assert gpu_seconds(probe) == (0.0, 0.0)  # the first tick of a leadership books nothing
    fleet.tick(after_s=10)
    assert gpu_seconds(probe) == (20.0, 10.0)  # 2 GPUs x 10 s billed; the quiet one's 10 s idle

    # The spend rate and the slots, as the last tick read them.
    assert probe.value(FLEET_SPEND_RATE.name, **L4) == pytest.approx(1.6)  # 2 x $0.80 an hour
    assert probe.value(FLEET_SLOTS.name, pool="l4", slot_state="busy") == 1
    assert probe.value(FLEET_SLOTS.name, pool="l4", slot_state="free") == 3

    fleet.tick(after_s=5)
    assert gpu_seconds(probe) == (30.0, 15.0)


def test_a_new_leader_books_nothing_for_the_time_before_its_first_tick(fleet: MeteredFleet) -> None:
    fleet.machine()
    fleet.machine()
    fleet.tick(replica="replica-a")
    fleet.tick(after_s=10, replica="replica-a")
    assert gpu_seconds(fleet.probe) == (20.0, 20.0)

    # replica-a stops renewing; replica-b takes over once its lease ran out, then hands
    # back the same way. Each leadership's first tick books nothing: no second counted twice,
    # and no gap booked at once.
    fleet.tick(after_s=20, replica="replica-b")
    fleet.tick(after_s=5, replica="replica-b")
    assert gpu_seconds(fleet.probe) == (30.0, 30.0)
    fleet.tick(after_s=20, replica="replica-a")
    assert gpu_seconds(fleet.probe) == (30.0, 30.0)
    fleet.tick(after_s=5, replica="replica-a")
    assert gpu_seconds(fleet.probe) == (40.0, 40.0)


def test_a_paused_leader_books_at_most_three_ticks_of_a_gap(fleet: MeteredFleet) -> None:
    fleet.machine(gpu_count=4)
    fleet.tick()
    # Paused for two minutes, still the leader when it wakes (nobody took over, so its lease
    # is renewed in the same epoch): the fleet it sees now is not what billed meanwhile, so
    # no more than three ticks are booked at once.
    fleet.tick(after_s=120)
    assert gpu_seconds(fleet.probe) == (4 * 3 * fleet.settings.tick_s,) * 2


def test_machines_held_for_films_and_warm_as_the_next_tick_reads_them(pg_url: str) -> None:
    with metered_fleet(pg_url, catalogue(warm_target=1, max_machines=2), max_running_machines=2) as fleet:
        first, second = fleet.machine(hourly_price_micros=700_000), fleet.machine()
        for n, (machine, slot) in enumerate([(first, 0), (first, 1), (second, 0), (second, 1)]):
            fleet.running(f"running-{n}", machine, slot, kind="capped" if machine == second else "short")
        fleet.job("film-1", kind="film")
        # The pool is full and may not grow: the film drains the machine whose jobs end
        # soonest, and the pool pins its cheapest machine warm.
        report = fleet.tick()
        assert report.actions["drain"] == 1 and report.actions["warm_pinned"] == 1
        probe = fleet.probe
        assert probe.value(FLEET_FILM_MACHINES.name, pool="l4", film_state="draining") == 0  # read before
        fleet.tick(after_s=1)
        assert probe.series(FLEET_FILM_MACHINES.name) == {
            (("film_state", "draining"), ("pool", "l4")): 1,
            (("film_state", "earmarked"), ("pool", "l4")): 0,
        }
        assert probe.series(FLEET_WARM_MACHINES.name) == {(("pool", "l4"),): 1}
        # A draining machine is not READY: only the other's slots are counted, both busy.
        assert probe.value(FLEET_SLOTS.name, pool="l4", slot_state="busy") == 2
        assert probe.value(FLEET_SLOTS.name, pool="l4", slot_state="free") == 0
