"""How close each plan tier's workspaces are to their plan's cap on GPU jobs at once, for the
plan-cap gauges. Pure: from the queue's count (:mod:`.queue_depth`) and what the tick holds.

A plan allows each of its workspaces ``max_gpu_jobs`` GPU jobs at once; the tick's demand
step (:func:`~gpufleet.scheduler.tick.decide.eligible_demand`) takes a workspace's queued
jobs only while its live ones and those taken so far are under that, and leaves the rest
waiting for PLAN_CONCURRENCY_LIMIT. So of a workspace's jobs that could start now, those
beyond ``max(0, cap - live)`` are held by its plan — the same figure whichever of them the
tick read (it reads at most the cap's worth; the count reads them all).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class PlanCapFigures:
    """Per plan tier (a label): each reported, zero when empty."""

    # Queued jobs that could start now but for their workspace's plan cap.
    held: dict[str, int]
    # Workspaces whose live GPU jobs reach their plan's cap (with work: live or startable jobs).
    at_cap: dict[str, int]
    # Live GPU jobs (the attempts the caps count).
    running: dict[str, int]


def plan_cap_figures(
    startable: Mapping[str, int],
    running: Mapping[str, int],
    limits: Mapping[str, int],
    tiers: Mapping[str, int],
    plan_tiers: Collection[str] = (),
) -> PlanCapFigures:
    """``startable``: workspace -> queued jobs that could start now; ``running``: workspace
    -> live attempts; ``limits`` and ``tiers``: each workspace's plan cap and tier (the
    snapshot's); ``plan_tiers``: every plan's tier, reported at zero when nothing is there.
    A workspace the snapshot did not know (made since) is left to the next tick."""
    held = dict.fromkeys(plan_tiers, 0)
    at_cap = dict.fromkeys(plan_tiers, 0)
    live = dict.fromkeys(plan_tiers, 0)
    for workspace in startable.keys() | running.keys():
        tier = tiers.get(workspace)
        if tier is None:
            continue
        key = str(tier)
        cap = limits.get(workspace, 0)
        n_running = running.get(workspace, 0)
        n_startable = startable.get(workspace, 0)
        held[key] = held.get(key, 0) + max(0, n_startable - max(0, cap - n_running))
        # At its cap with work: a plan allowing none is not counted for an idle workspace.
        full = n_running >= cap and n_running + n_startable > 0
        at_cap[key] = at_cap.get(key, 0) + int(full)
        live[key] = live.get(key, 0) + n_running
    return PlanCapFigures(held=held, at_cap=at_cap, running=live)
