"""The event-driven month and the month that evaluates everything are the same month.

The simulator runs a pool's fleet tick only when an event touched the pool, and a net's
pass only when a row can be due in its scan (its schedule's earliest row, a watch list not
empty); ``Sim(evaluate_everything=True)`` runs every pool's tick at every tick cadence and
every net's pass at every cadence instead. A touch the world forgets to make, or a wake a
net does not ask for, shows here as a different month. And ``wake_from_plan`` wakes each
pool at its decision's own requeue-after as well: the same month again.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufleet.sim.profile import PROFILES, SimConfig
from gpufleet.sim.report import summarize
from gpufleet.sim.world import Sim

DAYS, MACHINES = 2.0, 60


def _month(
    seed: int,
    policy: str,
    profile: str,
    evaluate_everything: bool,
    warm: int = 0,
    wake_from_plan: bool = False,
) -> tuple[Sim, dict[str, Any]]:
    config = SimConfig(days=DAYS, machines=MACHINES, seed=seed, faults=PROFILES[profile], warm_target=warm)
    sim = Sim(config, policy, evaluate_everything=evaluate_everything, wake_from_plan=wake_from_plan)
    sim.run()
    out = summarize(sim, 0.0)
    out.pop("wall_s", None)
    # How many decisions the fleet tick made is what the event-driven loop saves; the
    # fairness table samples the queue at each tick, so it is read at every tick too.
    out["decisions"].pop("fleet_tick", None)
    out.pop("fairness", None)
    return sim, out


# Three seeds of the real nets, the two counterfactual policies, the harsh profile
# (every failure class, dispatch back-offs, restarts and pauses); and pools with warm
# capacity (their idle clocks, pins and the pool idle release).
CASES = [
    (1, "nets", "default", 0),
    (2, "nets", "default", 0),
    (3, "nets", "default", 0),
    (1, "oracle", "default", 0),
    (2, "merged", "default", 0),
    (11, "nets", "harsh", 0),
    (11, "merged", "harsh", 0),
    (1, "nets", "default", 2),
    (12, "nets", "harsh", 2),
]


@pytest.mark.parametrize(("seed", "policy", "profile", "warm"), CASES)
def test_the_event_driven_month_is_the_month_that_evaluates_everything(
    seed: int, policy: str, profile: str, warm: int
) -> None:
    lazy, a = _month(seed, policy, profile, False, warm)
    eager, b = _month(seed, policy, profile, True, warm)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert lazy.net_passes == eager.net_passes
    # ... and the event-driven one decided far less often.
    assert lazy.metrics.decisions["fleet_tick"] * 3 < eager.metrics.decisions["fleet_tick"]


@pytest.mark.parametrize(("seed", "policy", "profile", "warm"), [CASES[0], CASES[5], CASES[8]])
def test_the_tick_woken_at_its_own_requeue_after_makes_the_same_month(
    seed: int, policy: str, profile: str, warm: int
) -> None:
    """The scheduler's decision says when it can next change with time alone
    (``TickPlan.next_wake``); the simulator wakes a pool for the clocks it knows instead.
    Woken at the decision's own wake as well, the month must not change: a gate the world
    forgets to wake for would show here."""
    lazy, a = _month(seed, policy, profile, False, warm)
    woken, b = _month(seed, policy, profile, False, warm, wake_from_plan=True)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert woken.metrics.decisions["fleet_tick"] > lazy.metrics.decisions["fleet_tick"]
