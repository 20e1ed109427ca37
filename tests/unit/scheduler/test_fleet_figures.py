"""The fleet's figures from one snapshot (what bills, what is idle, what it costs, slots,
films, warm machines, fair share by tier) and the GPU-seconds integrated between ticks,
from tables: no database, no clock but the snapshots' own."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.common.db.enums import MachineState
from gpufleet.common.lifecycle import BILLING_STATES
from gpufleet.scheduler.tick.fleet_figures import GpuMeter, fleet_figures
from tests.unit.scheduler.fleet_views import NOW, machine, running_on, snapshot

S = MachineState


def test_every_state_bills_but_stopped_and_destroyed() -> None:
    # DESIGN §2: a stop keeps the disk and ends the compute bill; a transition in flight
    # has not ended (or may already have begun) it.
    assert {S.STOPPED, S.DESTROYED}.isdisjoint(BILLING_STATES)
    assert set(S) - BILLING_STATES == {S.STOPPED, S.DESTROYED}


@pytest.mark.parametrize(
    ("state", "bills"),
    [(s.value, s in BILLING_STATES) for s in MachineState if s is not MachineState.DESTROYED],
)
def test_a_machine_counts_its_gpus_and_its_price_only_in_a_billing_state(state: str, bills: bool) -> None:
    figures = fleet_figures(snapshot([machine("m", state, gpu_count=8, hourly_price_micros=32_770_000)]))
    assert figures.gpus[("GCP", "l4")] == ((8, 8) if bills else (0, 0))
    assert figures.spend[("GCP", "l4")] == pytest.approx(32.77 if bills else 0.0)


def test_idle_is_a_billing_machine_with_no_live_attempt_on_any_slot() -> None:
    machines = [
        machine("busy", busy_slots=frozenset({0})),
        machine("quiet"),
        machine("booting", "BOOTING", gpu_count=2),  # billing, nothing on it yet: idle too
        machine("wound-down", busy_slots=frozenset({1})),  # an ended attempt's process, no live one
        machine("stopped", "STOPPED", gpu_count=4),
        machine("aws", provider="AWS", pool="a100", gpu_count=8, hourly_price_micros=40_000_000),
    ]
    figures = fleet_figures(snapshot(machines, [running_on("busy"), running_on("aws")]))
    assert figures.gpus == {("GCP", "l4"): (5, 4), ("AWS", "a100"): (8, 0)}
    assert figures.spend == {("GCP", "l4"): pytest.approx(5.0), ("AWS", "a100"): pytest.approx(40.0)}


def test_slots_are_those_of_ready_machines_by_pool_with_zeros_for_every_pool() -> None:
    machines = [
        machine("a", busy_slots=frozenset({0, 1})),
        machine("b", busy_slots=frozenset({3})),
        machine("draining", "DRAINING", busy_slots=frozenset({0})),  # not READY: not counted
        machine("box", pool=None, slots=2),
    ]
    assert fleet_figures(snapshot(machines)).slots == {
        ("l4", "busy"): 3,
        ("l4", "free"): 5,
        ("a100", "busy"): 0,
        ("a100", "free"): 0,
        ("none", "busy"): 0,
        ("none", "free"): 2,
    }


def test_films_count_earmarked_and_draining_machines_while_they_can_hold_a_film() -> None:
    machines = [
        machine("started-for-it", "BOOTING", earmarked_for="film-1"),
        machine("ready-for-it", earmarked_for="film-2"),
        machine("draining-for-it", "DRAINING", earmarked_for="film-3"),
        machine("drained-by-hand", "DRAINING"),  # an operator's drain: no film
        machine("stale", "STOPPED", earmarked_for="film-4"),  # released by this very tick
    ]
    assert fleet_figures(snapshot(machines)).films == {
        ("l4", "earmarked"): 2,
        ("l4", "draining"): 1,
        ("a100", "earmarked"): 0,
        ("a100", "draining"): 0,
    }


def test_warm_machines_are_the_pinned_running_ones_by_pool() -> None:
    machines = [
        machine("pinned", warm_held=True),
        machine("pinned-booting", "BOOTING", warm_held=True),
        machine("pin-left-on-a-stopped-one", "STOPPED", warm_held=True),
        machine("free"),
    ]
    assert fleet_figures(snapshot(machines)).warm == {"l4": 2, "a100": 0}


def test_fair_share_usage_is_summed_by_plan_tier_with_zeros_for_idle_tiers() -> None:
    figures = fleet_figures(
        snapshot(
            [],
            workspace_tiers={"free-1": 0, "free-2": 0, "studio": 2, "idle-pro": 1},
            usage_per_workspace={"free-1": 100.0, "free-2": 50.0, "studio": 7200.0},
        )
    )
    assert figures.fair_share == {"0": 150.0, "1": 0.0, "2": 7200.0}


# -- GPU-seconds between ticks ---------------------------------------------------------------
GPUS = {("GCP", "l4"): (2, 1), ("AWS", "a100"): (0, 0)}


def test_the_first_tick_books_nothing_and_each_next_books_the_time_since_the_last() -> None:
    meter = GpuMeter(max_gap_s=15.0)
    assert meter.measure(NOW, 1, GPUS) == {}
    assert meter.measure(NOW + timedelta(seconds=5), 1, GPUS) == {("GCP", "l4"): (10.0, 5.0)}
    assert meter.measure(NOW + timedelta(seconds=15), 1, GPUS) == {("GCP", "l4"): (20.0, 10.0)}


def test_a_gap_is_booked_up_to_the_cap_and_a_new_leadership_starts_from_nothing() -> None:
    meter = GpuMeter(max_gap_s=15.0)
    meter.measure(NOW, 1, GPUS)
    # Paused for an hour, still leading: three ticks' worth, not an hour at today's fleet.
    assert meter.measure(NOW + timedelta(hours=1), 1, GPUS) == {("GCP", "l4"): (30.0, 15.0)}
    # Deposed and elected again (a new epoch): the time between was another leader's.
    assert meter.measure(NOW + timedelta(hours=1, seconds=5), 2, GPUS) == {}
    assert meter.measure(NOW + timedelta(hours=1, seconds=10), 2, GPUS) == {("GCP", "l4"): (10.0, 5.0)}


def test_a_clock_that_did_not_move_or_went_back_books_nothing() -> None:
    meter = GpuMeter(max_gap_s=15.0)
    meter.measure(NOW, 1, GPUS)
    assert meter.measure(NOW, 1, GPUS) == {}
    assert meter.measure(NOW - timedelta(seconds=5), 1, GPUS) == {}
