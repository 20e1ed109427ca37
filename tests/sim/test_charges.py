"""A simulated month charges tenants as the worker does (issue #26): each charged attempt at
its plan's rate, through the one rule ``job_lifecycle.charge_micros`` that the job writer
also applies. The simulator once priced every attempt at the bare machine price."""

from __future__ import annotations

import pytest

from gpufleet.common.job_lifecycle import charge_micros
from gpufleet.sim import world
from gpufleet.sim.profile import PROFILES, SimConfig
from gpufleet.sim.world import Sim


def test_the_rule_prices_slot_seconds_at_the_plan_rate() -> None:
    # An hour of one slot of a two-slot machine at $4/h, at 1.2x: $2.40.
    assert charge_micros(3600.0, 4_000_000, 2, 1_200_000) == 2_400_000
    assert charge_micros(3600.0, 4_000_000, 2, 0) == 0
    assert charge_micros(1.0, 3600, 0, 1_000_000) == 1  # a row with no slots prices as one


def _month() -> Sim:
    sim = Sim(SimConfig(days=0.5, machines=40, seed=7, faults=PROFILES["default"]), "nets")
    sim.run()
    return sim


def test_a_month_charges_each_plan_at_its_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _month()
    charged = before.metrics.charged_micros
    assert set(charged) == set(world.PLANS), "every plan's tenants ran charged work"
    # The catalogue's creator plan is priced at 1.2x.
    creator = world.PLANS["creator"]
    assert creator.rate_micros == 1_200_000
    # Only the rate moves: doubling one plan's rate doubles what its tenants are charged
    # (to each attempt's rounding: half a micro-dollar in each month, so 1.5 per attempt)
    # and changes nothing else in the month.
    doubled = creator.model_copy(update={"rate_micros": 2 * creator.rate_micros})
    monkeypatch.setitem(world.PLANS, "creator", doubled)
    after = _month()
    again = after.metrics.charged_micros
    assert after.attempt_seq == before.attempt_seq
    assert charged["creator"] > 1_000_000  # a dollar's worth at least, far above the rounding
    assert abs(again["creator"] - 2 * charged["creator"]) <= 1.5 * before.attempt_seq
    for plan in ("studio", "free"):
        assert again[plan] == charged[plan], plan
    assert after.metrics.billed_s == before.metrics.billed_s
