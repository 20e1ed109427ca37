"""What a run found: one JSON-able dict per policy, and the side-by-side table."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from gpufleet.sim.fairness import by_plan
from gpufleet.sim.records import Failure
from gpufleet.sim.world import Sim

# What each failure class is caught by; its design limit is :func:`limits`'.
LIMITS: dict[str, str] = {
    "provision_stall": "provision deadline",
    "boot_never_completes": "boot failure",
    "worker_dies": "went silent / money chain",
    "worker_wedges": "went silent",
    "path_drop": "lost detector",
    "orphan": "orphan sweep",
    "preemption": "inventory reconcile",
    "stockout": "fleet tick (the call's answer)",
    "quota_error": "fleet tick (the call's answer)",
    "auth_error": "fleet tick (the call's answer)",
    "call_failed": "stuck transition",
    "call_timed_out": "stuck transition",
    "answer_lost": "stuck transition",
    "control_plane_restart": "restart",
    "leader_paused": "leadership",
    "clock_skew": "(harmless: never acted on)",
}


def limits(sim: Sim) -> dict[str, tuple[float, float]]:
    """Each class's design limit under the month's own settings: the net's threshold (with
    what the design adds to it: the grace a net waits, the re-confirmation on a second tick,
    the first sighting by the listing) and the cadence it runs at. A failure the design
    holds longer than its class's threshold (a worker dying inside went silent's grace
    after its machine came up: ``Failure.held_s``) is judged against that instead."""
    every = sim.every
    # Silent this long after the last report, which is up to one heartbeat before the
    # failure; the lease ends its attempts before then.
    silent = (sim.silent_after_s + sim.heartbeat_s, every["went_silent"])
    # The call's answer, seen by the next fleet tick.
    answered = (40.0, 5.0)
    stuck = (sim.stuck_after_s, every["stuck_transition"])
    out = {
        "provision_stall": (sim.scheduler.provision_deadline_s, every["provision_deadline"]),
        # The window from first observed (itself up to one listing after the boot) + the
        # second tick.
        "boot_never_completes": (
            sim.boot_window_s + every["inventory_reconcile"] + every["boot_failure"],
            every["boot_failure"],
        ),
        "worker_dies": silent,
        "worker_wedges": silent,
        # The probe fails on the idle scanner's next pass, then the lost threshold.
        "path_drop": (every["idle_scanner"] + sim.lost_after_s, every["lost_detector"]),
        # The grace from first sighting (up to one sweep after launch).
        "orphan": (sim.orphan_policy.grace.total_seconds() + every["orphan_sweep"], every["orphan_sweep"]),
        "preemption": (0.0, every["inventory_reconcile"]),
        "stockout": answered,
        "quota_error": answered,
        "auth_error": answered,
        # The transition is read again after the stuck limit.
        "call_failed": stuck,
        "call_timed_out": stuck,
        "answer_lost": stuck,
        "control_plane_restart": (120.0, 0.0),
        # A standby leader takes over once the paused one's lease has run out.
        "leader_paused": (sim.reaper_lease_ttl_s, 0.0),
        "clock_skew": (0.0, 0.0),
    }
    assert out.keys() == LIMITS.keys()
    return out


def summarize(sim: Sim, wall_s: float) -> dict[str, Any]:
    m = sim.metrics
    billed_h = m.billed_s / 3600.0
    useful_h = m.useful_s / 3600.0
    by_class: dict[str, list[Any]] = defaultdict(list)
    for f in sim.failures:
        by_class[f.cls].append(f)
    detections: dict[str, dict[str, Any]] = {}
    missed = 0
    for cls, (threshold, cadence) in limits(sim).items():
        net = LIMITS[cls]
        fs = by_class.get(cls, [])
        caught = [f for f in fs if f.caught_at is not None]
        latencies = sorted(f.caught_at - f.at for f in caught)

        def limit(f: Failure, threshold: float = threshold, cadence: float = cadence) -> float:
            return max(threshold, f.held_s) + cadence

        late = [f for f in caught if f.caught_at - f.at > limit(f) + f.outage_s + 1e-6]
        # Still open at the end of the month and not yet past its limit: not missed.
        pending = [f for f in fs if f.caught_at is None and sim.end - f.at <= limit(f)]
        missed += len(fs) - len(caught) - len(pending) + len(late)
        detections[cls] = {
            "caught_by": net,
            "injected": len(fs),
            "caught": len(caught),
            "pending_at_end": len(pending),
            "late": len(late),
            "p50_latency_s": round(statistics.median(latencies), 1) if latencies else None,
            "max_latency_s": round(latencies[-1], 1) if latencies else None,
            "threshold_s": threshold,
            "cadence_s": cadence,
        }
    jobs = sim.jobs.values()
    ended = sum(1 for j in jobs if j.state in ("SUCCEEDED", "FAILED", "TIMED_OUT"))
    waits: dict[str, dict[str, float]] = {}
    for (kind, plan), ws in sorted(m.waits.items()):
        ws = sorted(ws)
        waits[f"{kind}/{plan}"] = {
            "jobs": len(ws),
            "p50_s": round(ws[len(ws) // 2], 1),
            "p95_s": round(ws[int(len(ws) * 0.95)], 1),
        }
    return {
        "policy": sim.policy,
        "seed": sim.cfg.seed,
        "days": sim.cfg.days,
        "machines": sim.cfg.machines,
        "warm_target": sim.cfg.warm_target,
        "healthy_destroys": m.healthy_destroys,
        "jobs_lost": _jobs_lost(sim),
        "jobs_run_twice_at_once": m.jobs_run_twice_at_once,
        "jobs": len(sim.jobs),
        "jobs_ended": ended,
        "jobs_failed_our_side": sum(1 for j in jobs if j.failed_our_side),
        # Failed by the queue-wait timeout: waited past their kind's deadline.
        "jobs_failed_waiting": m.queue_wait_timeouts,
        "attempt_ends": dict(sorted(m.attempt_ends.items())),
        "machines_created": sim.ordinal,
        "gpu_hours_billed": round(billed_h, 1),
        "useful_gpu_hours": round(useful_h, 1),
        "idle_gpu_hours": round(billed_h - useful_h, 1),
        "cost_usd": round(m.cost_micros / 1e6, 2),
        "charged_usd": round(sum(m.charged_micros.values()) / 1e6, 2),
        "charged_usd_by_plan": {p: round(v / 1e6, 2) for p, v in sorted(m.charged_micros.items())},
        "idle_gpu_hours_by_cause": {
            k: round(v / 3600.0, 1) for k, v in sorted(m.idle_by_cause.items(), key=lambda kv: -kv[1])
        },
        "missed_or_late_detections": missed,
        "detections": detections,
        "queue_wait": waits,
        "provider_calls": m.provider_calls,
        "decisions": dict(sorted(m.decisions.items())),
        "refusals": dict(sorted(m.refusals.items())),
        "violations": sim.violations[:20],
        "fairness": fairness_summary(sim),
        "wall_s": round(wall_s, 2),
        # The simulator's speed: simulated seconds of the month per wall second of its run.
        "sim_seconds_per_wall_second": round(sim.end / wall_s) if wall_s > 0 else None,
    }


def fairness_summary(sim: Sim) -> dict[str, Any]:
    """The month's fair share (:mod:`gpufleet.sim.fairness` defines each figure): by plan,
    and every workspace that contended, the worst error first."""
    rows = sim.fairness.rows()
    return {"by_plan": by_plan(rows), "workspaces": rows}


def _jobs_lost(sim: Sim) -> int:
    """Jobs neither ended, nor queued, nor running on a live attempt."""
    lost = 0
    for j in sim.jobs.values():
        if j.state in ("SUCCEEDED", "FAILED", "TIMED_OUT"):
            continue
        if j.state == "QUEUED" and j.id in sim.queued[j.pool]:
            continue
        if j.live is not None and j.live.state in ("STARTING", "RUNNING"):
            continue
        lost += 1
    return lost


def combine(results: dict[str, dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """The run's one JSON object: the real nets' figures at the top, each policy's beside."""
    nets = results["nets"]
    out = {k: v for k, v in nets.items() if k != "policy"}
    out["oracle_idle_gpu_hours"] = results["oracle"]["idle_gpu_hours"]
    out["merged_check_idle_gpu_hours"] = results["merged"]["idle_gpu_hours"]
    oracle_idle = max(results["oracle"]["idle_gpu_hours"], 1e-9)
    merged_idle = max(results["merged"]["idle_gpu_hours"], 1e-9)
    out["idle_vs_oracle"] = round(nets["idle_gpu_hours"] / oracle_idle, 3)
    out["idle_vs_merged_check"] = round(nets["idle_gpu_hours"] / merged_idle, 3)
    out["share_of_cost_without_work"] = round(nets["idle_gpu_hours"] / max(nets["gpu_hours_billed"], 1e-9), 3)
    out["policies"] = {
        p: {k: v for k, v in r.items() if k not in ("detections", "fairness")} for p, r in results.items()
    }
    out["policies_detections"] = {p: r["detections"] for p, r in results.items()}
    out["wall_s"] = round(wall_s, 2)
    return out


def table(out: dict[str, Any]) -> str:
    """The side-by-side table and the detections, for people."""
    pol = out["policies"]
    rows = [
        ("healthy machines destroyed", "healthy_destroys"),
        ("jobs lost", "jobs_lost"),
        ("jobs with two live attempts", "jobs_run_twice_at_once"),
        ("jobs failed on our side", "jobs_failed_our_side"),
        ("jobs failed waiting (queue-wait deadline)", "jobs_failed_waiting"),
        ("GPU-hours billed", "gpu_hours_billed"),
        ("  of which idle (no job)", "idle_gpu_hours"),
        ("cost (USD)", "cost_usd"),
        ("charged to tenants (USD)", "charged_usd"),
        ("failures missed or late", "missed_or_late_detections"),
    ]
    lines = [
        f"{out['days']:g} days, {out['machines']} machines at most, seed {out['seed']}: "
        f"{out['jobs']} jobs, {out['machines_created']} machines created"
        + (f", {out['warm_target']} kept warm a pool" if out.get("warm_target") else ""),
        "",
        f"{'':32}{'real nets':>14}{'oracle':>14}{'merged check':>14}",
    ]
    for label, key in rows:
        lines.append(
            f"{label:32}" + "".join(f"{_fmt(pol[p][key]):>14}" for p in ("nets", "oracle", "merged"))
        )
    lines += [
        "",
        f"idle GPU-hours: {out['idle_vs_oracle']:.3f} x the oracle, "
        f"{out['idle_vs_merged_check']:.3f} x the merged check; "
        f"{100 * out['share_of_cost_without_work']:.1f}% of the billed hours bought no work",
        "",
        f"{'failure class':24}{'caught by':30}{'injected':>9}{'caught':>8}"
        f"{'p50 s':>9}{'max s':>9}{'limit s':>9}",
    ]
    for cls, d in out["detections"].items():
        limit = d["threshold_s"] + d["cadence_s"]
        lines.append(
            f"{cls:24}{d['caught_by']:30}{d['injected']:>9}{d['caught']:>8}"
            f"{_fmt(d['p50_latency_s']):>9}{_fmt(d['max_latency_s']):>9}{limit:>9.0f}"
        )
    lines += ["", *fairness_table(out["fairness"]), ""]
    speeds = ", ".join(
        f"{p} {_fmt(pol[p]['sim_seconds_per_wall_second'])}" for p in ("nets", "oracle", "merged")
    )
    lines.append(f"wall time {out['wall_s']:.1f} s; speed (simulated s per wall s): {speeds}")
    return "\n".join(lines)


def fairness_table(fairness: dict[str, Any], worst: int = 10) -> list[str]:
    """Fair share under the real nets: by plan, then the workspaces with the worst error."""
    lines = [
        "fair share (real nets; slot-hours while contending: received vs entitled by plan weight)",
        f"{'plan':12}{'workspaces':>11}{'received':>10}{'entitled':>10}{'ratio':>8}{'worst error':>13}",
    ]
    for plan, p in fairness["by_plan"].items():
        lines.append(
            f"{plan:12}{p['workspaces']:>11}{p['received_slot_h']:>10.1f}{p['entitled_slot_h']:>10.1f}"
            f"{_ratio(p['received_vs_entitled']):>8}{p['worst_error']:>+13.3f}"
        )
    rows = fairness["workspaces"][:worst]
    if rows:
        lines += [
            "",
            f"{'workspace':12}{'plan':>8}{'ticks':>7}{'received':>10}{'entitled':>10}{'ratio':>8}"
            f"{'mean |err|':>11}{'worst error':>13}",
        ]
        for r in rows:
            lines.append(
                f"{r['workspace']:12}{r['plan']:>8}{r['ticks']:>7}{r['received_slot_h']:>10.2f}"
                f"{r['entitled_slot_h']:>10.2f}{_ratio(r['received_vs_entitled']):>8}"
                f"{_ratio(r['mean_abs_error']):>11}{r['worst_error']:>+13.3f}"
            )
    return lines


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)
