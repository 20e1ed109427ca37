"""Where a control-plane loop's passes fall (``sim.clock.Passes``): on its cadence from the
month's start, then — after its process stops and a new one starts — at the new process's
start and every cadence from there, with none in between, as the services' ``Ticker`` runs a
new process's tasks (at once, then ``next_at = now + cadence``)."""

from __future__ import annotations

import math
import random

import pytest

from gpufleet.sim.clock import Passes


def test_a_loop_never_restarted_is_the_plain_grid_from_one_cadence_in() -> None:
    loop = Passes(30.0)
    rng = random.Random(7)
    for t in [0.0, 1.0, 29.999, 30.0, 30.001, 59.0, 60.0, *(rng.uniform(0, 1e6) for _ in range(500))]:
        assert loop.ceil(t) == max(1, math.ceil(t / 30.0)) * 30.0, t
        assert loop.after(t) == (math.floor(t / 30.0) + 1) * 30.0, t
        expected_floor = math.floor(t / 30.0) * 30.0
        assert loop.floor(t) == (expected_floor if expected_floor >= 30.0 else -math.inf), t
    assert loop.count(600.0) == 20 and loop.count(599.0) == 19


def test_a_restart_stops_the_passes_and_starts_them_on_the_new_processes_grid() -> None:
    loop = Passes(60.0)
    loop.restart(600.0, 930.0)
    # None from the stop (a pass at the very instant it stopped does not run) to the start.
    assert loop.ceil(540.0) == 540.0 and loop.after(540.0) == 930.0
    assert loop.ceil(600.0) == 930.0 and loop.ceil(700.0) == 930.0
    assert loop.floor(599.0) == 540.0 and loop.floor(929.0) == 540.0
    # The new process's first pass as it starts, then every cadence from it.
    assert loop.ceil(930.0) == 930.0 and loop.after(930.0) == 990.0 and loop.ceil(931.0) == 990.0
    assert loop.floor(1000.0) == 990.0
    assert loop.count(1000.0) == 9 + 2
    # What a paused leader owes when it wakes: a pass fell due while it slept.
    assert not loop.owes(600.0, 930.0) and loop.owes(930.0, 931.0) and not loop.owes(931.0, 990.0)


def test_a_second_stop_before_the_first_restart_ended_keeps_the_later_start() -> None:
    loop = Passes(30.0)
    loop.restart(100.0, 300.0)
    loop.restart(200.0, 250.0)  # a shorter one within: the processes are back at 300
    assert loop.ceil(101.0) == 300.0
    loop.restart(250.0, 400.0)  # a longer one within: back at 400
    assert loop.ceil(101.0) == 400.0 and loop.after(400.0) == 430.0
    loop.restart(500.0, 520.0)
    assert loop.floor(510.0) == 490.0 and loop.ceil(501.0) == 520.0


def test_a_new_grid_off_the_whole_seconds_adds_up_exactly() -> None:
    """Each pass is exactly the float ``start + k * every``, and a time equal to one is that
    pass (the quotient alone can be an ulp off)."""
    start = 88272.38989486170
    loop = Passes(30.0)
    loop.restart(88183.7, start)
    for k in range(0, 2000):
        at = start + k * 30.0
        assert loop.ceil(at) == at and loop.floor(at) == at, k
        assert loop.after(at) == start + (k + 1) * 30.0, k


def test_a_cadence_must_be_positive_and_a_restart_cannot_start_before_it_stopped() -> None:
    with pytest.raises(ValueError, match="positive"):
        Passes(0.0)
    with pytest.raises(ValueError, match="before it stopped"):
        Passes(30.0).restart(100.0, 50.0)
