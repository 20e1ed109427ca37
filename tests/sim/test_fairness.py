"""The fairness table's figures on cases worked by hand (gpufleet.sim.fairness defines them)."""

from __future__ import annotations

import pytest

from gpufleet.sim.fairness import FairnessLedger, by_plan, entitlements


def test_water_filling_shares_by_weight_and_gives_what_a_capped_one_cannot_use_to_the_others() -> None:
    # 12 slots; weights 2:1:1. Nobody capped: 6, 3, 3.
    assert entitlements(12.0, {"a": (2.0, 12.0), "b": (1.0, 12.0), "c": (1.0, 12.0)}) == {
        "a": 6.0,
        "b": 3.0,
        "c": 3.0,
    }
    # c can use only 1: the 2 it leaves go to a and b as 2:1.
    got = entitlements(12.0, {"a": (2.0, 12.0), "b": (1.0, 12.0), "c": (1.0, 1.0)})
    assert got == pytest.approx({"a": 22 / 3, "b": 11 / 3, "c": 1.0})
    assert sum(got.values()) == pytest.approx(12.0)


def test_a_month_of_two_ticks_gives_slot_seconds_ratio_mean_and_worst_error() -> None:
    ledger = FairnessLedger({"studio-1": ("studio", 2.0), "free-1": ("free", 0.5), "free-2": ("free", 0.5)})
    # t=0: studio-1 holds 2, free-1 holds 8 of the pie of 10; both want more (caps 20).
    # Entitled by weight 2 : 0.5 -> 8 and 2. Errors: (2 - 8) / 10 = -0.6, (8 - 2) / 10 = +0.6.
    ledger.sample("p", 0.0, [("studio-1", 2.0, 20.0), ("free-1", 8.0, 20.0)])
    # t=100: free-1 is at its plan's cap holding 1 (cap = what it holds), under its weight's
    # 2 of 10: it is entitled to 1, studio-1 to the other 9 — exactly what each holds.
    ledger.sample("p", 100.0, [("studio-1", 9.0, 20.0), ("free-1", 1.0, 1.0)])
    # t=300: only one workspace waits: no contention, nothing measured after.
    ledger.sample("p", 300.0, [("studio-1", 10.0, 12.0)])
    ledger.close(1000.0)
    rows = {r["workspace"]: r for r in ledger.rows()}
    assert set(rows) == {"studio-1", "free-1"}  # free-2 never contended
    s, f = rows["studio-1"], rows["free-1"]
    assert s["ticks"] == f["ticks"] == 2
    # studio-1: received 2 x 100 + 9 x 200 = 2000 slot-s; entitled 8 x 100 + 9 x 200 = 2600.
    assert s["received_slot_h"] == round(2000 / 3600, 2)
    assert s["entitled_slot_h"] == round(2600 / 3600, 2)
    assert s["received_vs_entitled"] == round(2000 / 2600, 3)
    # |error| 0.6 for 100 s, 0 for 200 s: mean 0.2; worst -0.6 (sign kept).
    assert s["mean_abs_error"] == 0.2
    assert s["worst_error"] == -0.6
    assert f["worst_error"] == 0.6
    # free-1: received 8 x 100 + 1 x 200 = 1000; entitled 2 x 100 + 1 x 200 = 400.
    assert f["received_vs_entitled"] == 2.5
    plans = by_plan(ledger.rows())
    assert plans["studio"]["workspaces"] == 1
    assert plans["free"]["worst_error"] == 0.6


def test_the_report_carries_the_fairness_table_and_the_speed() -> None:
    from gpufleet.sim.profile import SimConfig
    from gpufleet.sim.report import fairness_table, summarize
    from gpufleet.sim.world import Sim

    sim = Sim(SimConfig(days=1, machines=40, seed=3))
    sim.run()
    out = summarize(sim, 2.0)
    assert out["sim_seconds_per_wall_second"] == round(86400 / 2.0)
    rows = out["fairness"]["workspaces"]
    assert rows, "a day of 40 machines has workspaces waiting together"
    assert all(-1.0 <= r["worst_error"] <= 1.0 for r in rows)
    assert set(out["fairness"]["by_plan"]) <= {"free", "creator", "studio"}
    assert fairness_table(out["fairness"])[0].startswith("fair share")
