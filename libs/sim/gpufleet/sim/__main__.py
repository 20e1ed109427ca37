"""``python -m gpufleet.sim`` (and ``gpufleet simulate``): a simulated month, three policies
side by side on one seed.

The three policies run in processes of their own (they share nothing but the seed), so a
two-core machine runs a month of 500 machines in about the time of the slowest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.sim.nets import NetSettings, SettingRefused
from gpufleet.sim.profile import PROFILES, SimConfig, Workload
from gpufleet.sim.report import combine, summarize, table
from gpufleet.sim.world import POLICIES, InvariantBroken, Sim


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpufleet simulate",
        description="Simulate a month of the fleet with gpufleet's real decisions, every failure "
        "class injected, and compare the real nets with an oracle and a single merged health check.",
    )
    p.add_argument("--days", type=float, default=30.0, help="simulated days (default 30)")
    p.add_argument("--machines", type=int, default=500, help="the fleet's ceiling of running machines (500)")
    p.add_argument("--seed", type=int, default=1, help="one seed reproduces the whole run, bit for bit")
    p.add_argument("--profile", choices=sorted(PROFILES), default="default", help="fault rates (default)")
    p.add_argument("--load", type=float, default=Workload().mean_load, help="mean share of slots asked for")
    p.add_argument(
        "--tick-s", type=float, default=SimConfig().tick_s, help="fleet tick cadence (30; scheduler: 5)"
    )
    p.add_argument(
        "--policies", default=",".join(POLICIES), help="comma-separated subset of nets,oracle,merged"
    )
    p.add_argument(
        "--warm-target",
        type=int,
        default=SimConfig().warm_target,
        help="machines each pool keeps warm while it has work, as a catalogue pool's warm_target (0)",
    )
    p.add_argument("--plant", choices=["went_silent_reads_composite"], help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.add_argument("--plot", metavar="DIR", help="write PNG charts of the run into DIR")
    p.add_argument("--processes", type=int, default=0, help="worker processes (default: one a month)")
    p.add_argument(
        "--sweep",
        metavar="NAME=V1,V2,...",
        help="one month under the real nets per value of one reaper, sweeper or scheduler setting "
        "the simulator reads (e.g. went_silent_after_s=300,600,900,1800), side by side",
    )
    return p


_progress: Any = None


def _init(progress: Any) -> None:
    global _progress
    _progress = progress


def _one(
    cfg: SimConfig, label: str, policy: str, plant: str | None, settings: NetSettings | None
) -> dict[str, Any]:
    progress = _progress
    t0 = time.perf_counter()
    sim = Sim(cfg, policy, plant=plant, settings=settings)

    def tick(t: float) -> None:
        if progress is not None:
            progress.put((label, t))

    try:
        sim.run(on_progress=tick)
    except InvariantBroken as exc:
        return {"policy": policy, "invariant_broken": str(exc)}
    out = summarize(sim, time.perf_counter() - t0)
    out["_samples"] = sim.metrics.samples
    out["_waits"] = {f"{k}/{p}": v for (k, p), v in sim.metrics.waits.items()}
    out["_latencies"] = _latencies(sim)
    return out


def _latencies(sim: Sim) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for f in sim.failures:
        if f.caught_at is not None:
            out.setdefault(f.cls, []).append(f.caught_at - f.at)
    return out


def run(
    cfg: SimConfig, policies: list[str], plant: str | None, processes: int, show: bool
) -> dict[str, dict[str, Any]]:
    """Each policy in its own process, with one progress bar for all. One a policy even on
    fewer CPUs: three sharing two cores end together at 1.5 runs' time, where two workers
    would take two (two runs, then the third alone)."""
    return run_tasks(cfg, {p: (p, None) for p in policies}, plant, processes, show)


def run_tasks(
    cfg: SimConfig,
    tasks: dict[str, tuple[str, NetSettings | None]],
    plant: str | None,
    processes: int,
    show: bool,
) -> dict[str, dict[str, Any]]:
    """Each month (label -> policy and the services' settings, None for their defaults) in
    a process of its own, with one progress bar for all."""
    n = processes or len(tasks)
    ctx = mp.get_context("fork")
    manager_q: Any = ctx.Queue()
    done: dict[str, float] = dict.fromkeys(tasks, 0.0)
    end = cfg.days * 86400.0
    with ctx.Pool(n, initializer=_init, initargs=(manager_q,)) as pool:
        pending = {
            label: pool.apply_async(_one, (cfg, label, policy, plant, settings))
            for label, (policy, settings) in tasks.items()
        }
        last = 0.0
        while any(not r.ready() for r in pending.values()):
            try:
                while True:
                    p, t = manager_q.get(timeout=0.2)
                    done[p] = max(done[p], t)
            except Exception:  # queue.Empty
                pass
            if show and time.monotonic() - last > 0.5:
                last = time.monotonic()
                _bar(done, end)
        results = {p: r.get() for p, r in pending.items()}
    if show:
        _bar(dict.fromkeys(tasks, end), end)
        sys.stderr.write("\n")
    return results


def _bar(done: dict[str, float], end: float) -> None:
    parts = []
    for p, t in done.items():
        frac = min(1.0, t / end) if end else 1.0
        filled = int(frac * 20)
        parts.append(f"{p:>6} [{'#' * filled}{'.' * (20 - filled)}] day {t / 86400:5.1f}")
    sys.stderr.write("\r" + "  ".join(parts))
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.days <= 0 or args.machines <= 0:
        parser().error("--days and --machines must be positive")
    if not 0 < args.load <= 2:
        parser().error("--load must be in (0, 2]")
    if not 1 <= args.tick_s <= 600:
        parser().error("--tick-s must be between 1 and 600")
    if not 0 <= args.warm_target <= args.machines:
        parser().error("--warm-target must be between 0 and --machines")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        parser().error(
            f"--policies: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(POLICIES)}"
        )
    cfg = SimConfig(
        days=args.days,
        machines=args.machines,
        seed=args.seed,
        tick_s=args.tick_s,
        warm_target=args.warm_target,
        faults=PROFILES[args.profile],
        workload=dataclasses.replace(Workload(), mean_load=args.load),
    )
    show = not args.json and sys.stderr.isatty()
    if args.sweep is not None:
        return _sweep(args, cfg, show)
    t0 = time.perf_counter()
    results = run(cfg, policies, args.plant, args.processes, show=show)
    wall = time.perf_counter() - t0
    broken = {p: r["invariant_broken"] for p, r in results.items() if "invariant_broken" in r}
    if broken:
        for p, why in broken.items():
            print(f"gpufleet simulate: invariant broken under {p}: {why}", file=sys.stderr)
        return 1
    if args.plot:
        from gpufleet.sim.plots import write_plots

        paths = write_plots(Path(args.plot), results)
        if not args.json:
            print("charts: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    clean = {p: {k: v for k, v in r.items() if not k.startswith("_")} for p, r in results.items()}
    if set(policies) == set(POLICIES):
        out = combine(clean, wall)
        print(json.dumps(out, indent=2) if args.json else table(out))
    else:
        print(json.dumps({"policies": clean, "wall_s": round(wall, 2)}, indent=2))
    return 0


def _sweep(args: argparse.Namespace, cfg: SimConfig, show: bool) -> int:
    """One month a value, under the real nets: every value's settings validated first."""
    from gpufleet.sim import sweep

    try:
        plan = sweep.parse(args.sweep)
    except SettingRefused as exc:
        parser().error(f"--sweep {exc}")
    tasks: dict[str, tuple[str, NetSettings | None]] = {
        v: ("nets", s) for v, s in zip(plan.values, plan.settings, strict=True)
    }
    t0 = time.perf_counter()
    results = run_tasks(cfg, tasks, args.plant, args.processes, show=show)
    wall = time.perf_counter() - t0
    broken = {v: r["invariant_broken"] for v, r in results.items() if "invariant_broken" in r}
    if broken:
        for v, why in broken.items():
            print(f"gpufleet simulate: invariant broken with {plan.name}={v}: {why}", file=sys.stderr)
        return 1
    rows = {v: sweep.row(r) for v, r in results.items()}
    if args.plot:
        from gpufleet.sim.plots import write_sweep_plot

        path = write_sweep_plot(Path(args.plot), plan.name, rows)
        if not args.json:
            print(f"chart: {path}", file=sys.stderr)
    if args.json:
        print(json.dumps({"sweep": plan.name, "values": rows, "wall_s": round(wall, 2)}, indent=2))
    else:
        header = (
            f"{cfg.days:g} days, {cfg.machines} machines at most, seed {cfg.seed}, real nets: "
            f"{plan.name} swept (wall time {wall:.1f} s)"
        )
        print(sweep.table(plan.name, rows, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
