"""How the simulator's wall time grows with the fleet and with the days simulated.

Run it as ``.venv/bin/python benchmarks/simulate.py`` (not a test: it prints figures). It
runs the real nets' policy alone, in this process, on one seed, for a few fleet sizes at a
fixed number of days and a few lengths at a fixed fleet, and prints the wall time, the
events' figures (jobs, fleet ticks decided) and each row's ratio against the first row of
its group, measured in the same run. ``--tick-s 5`` runs the scheduler's own tick cadence.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from gpufleet.sim.profile import SimConfig
from gpufleet.sim.world import Sim


def one(days: float, machines: int, seed: int, tick_s: float) -> dict[str, Any]:
    sim = Sim(SimConfig(days=days, machines=machines, seed=seed, tick_s=tick_s), "nets")
    t0 = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - t0
    return {
        "days": days,
        "machines": machines,
        "wall_s": round(wall, 2),
        "jobs": len(sim.jobs),
        "fleet_ticks": sim.metrics.decisions["fleet_tick"],
        "machines_created": sim.ordinal,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=float, default=3.0, help="days for the fleet-size group (3)")
    p.add_argument("--machines", default="100,500,2000", help="fleet sizes (100,500,2000)")
    p.add_argument("--lengths", default="1,3,10", help="days for the length group, at 500 machines")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tick-s", type=float, default=SimConfig().tick_s)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    by_size = [one(args.days, int(n), args.seed, args.tick_s) for n in args.machines.split(",")]
    by_days = [one(float(d), 500, args.seed, args.tick_s) for d in args.lengths.split(",")]
    if args.json:
        print(json.dumps({"by_machines": by_size, "by_days": by_days}, indent=2))
        return
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


if __name__ == "__main__":
    main()
