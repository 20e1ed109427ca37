"""How the simulator's wall time grows with the fleet and with the days simulated.

Run it as ``.venv/bin/python benchmarks/simulate.py`` (not a test: it prints figures). It
runs the real nets' policy alone, in this process, on one seed, for a few fleet sizes at a
fixed number of days and a few lengths at a fixed fleet, and prints the wall time, the
events' figures (jobs, fleet ticks decided) and each row's ratio against the first row of
its group, measured in the same run. ``--tick-s 5`` runs the scheduler's own tick cadence.

Every row is checked for the work it reports before a figure is printed
(:func:`self_check`): jobs arrived and ran to success, machines were created, the fleet
tick decided, simulated time went by — and the month's invariants held (no healthy
machine destroyed, no job run twice at once, no provider call without its intent). A run
that did nothing fast fails the benchmark (exit 1); so does one that broke a rule.
``tests/benchmarks/test_simulate_smoke.py`` runs it at a tiny size in the default suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpufleet.common.job_lifecycle import EndCause
from gpufleet.sim.profile import SimConfig
from gpufleet.sim.world import Sim

DAY_S = 86_400.0


def one(days: float, machines: int, seed: int, tick_s: float) -> dict[str, Any]:
    sim = Sim(SimConfig(days=days, machines=machines, seed=seed, tick_s=tick_s), "nets")
    t0 = time.perf_counter()
    metrics = sim.run()
    wall = time.perf_counter() - t0
    return {
        "days": days,
        "machines": machines,
        "wall_s": round(wall, 2),
        "sim_seconds_per_wall_second": round(days * DAY_S / max(wall, 1e-9)),
        "simulated_s": sim.q.now,
        "jobs": len(sim.jobs),
        "attempts_succeeded": metrics.attempt_ends[EndCause.SUCCEEDED.value],
        "fleet_ticks": metrics.decisions["fleet_tick"],
        "machines_created": sim.ordinal,
        "provider_calls": metrics.provider_calls,
        "healthy_destroys": metrics.healthy_destroys,
        "jobs_run_twice_at_once": metrics.jobs_run_twice_at_once,
        "calls_without_intent": metrics.calls_without_intent,
    }


def self_check(rows: Sequence[dict[str, Any]]) -> list[str]:
    """What is wrong with the work the rows claim (empty: nothing)."""
    problems: list[str] = []
    for r in rows:
        at = f"{r['days']:g} d x {r['machines']} machines"
        if r["simulated_s"] < r["days"] * DAY_S:
            problems.append(f"{at}: stopped at {r['simulated_s']:,.0f} s of {r['days'] * DAY_S:,.0f}")
        for figure in ("jobs", "attempts_succeeded", "fleet_ticks", "machines_created", "provider_calls"):
            if r[figure] <= 0:
                problems.append(f"{at}: {figure} is {r[figure]}: the month did no work")
        if r["jobs"] > 0 and r["attempts_succeeded"] < r["jobs"] / 2:
            problems.append(f"{at}: only {r['attempts_succeeded']} of {r['jobs']} jobs succeeded")
        for rule in ("healthy_destroys", "jobs_run_twice_at_once", "calls_without_intent"):
            if r[rule]:
                problems.append(f"{at}: {rule} = {r[rule]} (must be 0)")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=float, default=3.0, help="days for the fleet-size group (3)")
    p.add_argument("--machines", default="100,500,2000", help="fleet sizes (100,500,2000)")
    p.add_argument("--lengths", default="1,3,10", help="days for the length group (1,3,10)")
    p.add_argument("--length-machines", type=int, default=500, help="fleet for the length group (500)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tick-s", type=float, default=SimConfig().tick_s)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    by_size = [one(args.days, int(n), args.seed, args.tick_s) for n in args.machines.split(",")]
    by_days = [one(float(d), args.length_machines, args.seed, args.tick_s) for d in args.lengths.split(",")]
    problems = self_check(by_size + by_days)
    verdict = "ok" if not problems else "FAILED"
    if args.json:
        print(f"self-check: {verdict}")
        doc = {"by_machines": by_size, "by_days": by_days, "self_check": verdict, "problems": problems}
        print(json.dumps(doc))
        return 1 if problems else 0
    for title, rows, key in (("by fleet size", by_size, "machines"), ("by days simulated", by_days, "days")):
        base = rows[0]
        print(f"{title} (baseline: the first row; tick every {args.tick_s:g} s)")
        print(
            f"  {'days':>5} {'machines':>9} {'jobs':>9} {'ticks':>8} {'wall s':>8}"
            f" {'x wall':>7} {'x ' + key:>11}"
        )
        for r in rows:
            print(
                f"  {r['days']:>5g} {r['machines']:>9} {r['jobs']:>9} {r['fleet_ticks']:>8}"
                f" {r['wall_s']:>8.2f}"
                f" {r['wall_s'] / base['wall_s']:>7.2f} {r[key] / base[key]:>11.2f}"
            )
        rate = rows[-1]["days"] * rows[-1]["machines"] / rows[-1]["wall_s"]
        print(f"  {rate:,.0f} machine-days simulated per wall second at the last row")
    print(f"self-check: {verdict}")
    for problem in problems:
        print(f"  {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
