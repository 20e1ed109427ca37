"""The plan caps' figures per tier, from each workspace's jobs that could start, its live
ones, its plan's cap and tier: what the fleet tick's demand step would hold, counted."""

from __future__ import annotations

from gpufleet.scheduler.tick.plan_caps import PlanCapFigures, plan_cap_figures

TIERS = {"studio": 1, "studio-2": 1, "free": 0, "idle-free": 0, "none": 2}


def test_jobs_beyond_the_room_a_cap_leaves_are_held_and_a_full_workspace_is_at_its_cap() -> None:
    figures = plan_cap_figures(
        # Queued jobs that could start now.
        startable={"studio": 5, "studio-2": 1, "free": 4},
        # Live attempts.
        running={"studio": 1, "free": 1, "studio-2": 4},
        limits={"studio": 4, "studio-2": 4, "free": 1, "idle-free": 1, "none": 0},
        tiers=TIERS,
        plan_tiers=("0", "1", "2"),
    )
    assert figures == PlanCapFigures(
        # studio: room for 3 of its 5; studio-2 is full (its 1 held); free: full, all 4 held.
        held={"0": 4, "1": 2 + 1, "2": 0},
        at_cap={"0": 1, "1": 1, "2": 0},
        running={"0": 1, "1": 5, "2": 0},
    )


def test_a_lowered_cap_holds_every_queued_job_and_a_plan_allowing_none_counts_only_with_work() -> None:
    figures = plan_cap_figures(
        startable={"studio": 2, "none": 3},
        running={"studio": 6},  # the cap went from 8 to 4 while six ran
        limits={"studio": 4, "none": 0, "idle-free": 0},
        tiers=TIERS,
        plan_tiers=("0", "1", "2"),
    )
    assert figures.held == {"0": 0, "1": 2, "2": 3}
    # The plan allowing none: its workspace with jobs is at its cap; an idle one is not.
    assert figures.at_cap == {"0": 0, "1": 1, "2": 1}


def test_a_workspace_the_snapshot_did_not_know_waits_for_the_next_tick() -> None:
    figures = plan_cap_figures({"new": 3}, {}, {}, {}, plan_tiers=("0",))
    assert figures == PlanCapFigures(held={"0": 0}, at_cap={"0": 0}, running={"0": 0})
