"""The snapshot reads only each workspace's oldest ``queued_read_bound(cap)`` queued jobs.
That is safe only while the decision would take nothing else: here the whole plan is
compared, from whole queues and from queues cut to the bound, over generated fleets (films
and shorts, ties in age, workspaces at, under and over their caps, unknown workspaces) —
the reasons the waiting jobs are given included: a job beyond the bound, held back, is
told it waits for its plan's places as the whole queue's decision tells it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.scheduler.tick.decide import decide, queued_read_bound
from gpufleet.scheduler.tick.model import FleetSnapshot, HeldBackJob, JobView, TickPlan
from tests.unit.scheduler.test_decide import POLICY, job, machine, snapshot


def cut_to_bound(snap: FleetSnapshot) -> FleetSnapshot:
    """The queue as the snapshot reads it: each workspace's oldest jobs up to the bound; the
    others held back (their reason not recorded yet), as the snapshot offers them."""
    by_ws: dict[str, list[JobView]] = {}
    for j in snap.queued:
        by_ws.setdefault(j.workspace_id, []).append(j)
    kept: list[JobView] = []
    held: list[HeldBackJob] = []
    for ws, jobs in by_ws.items():
        jobs.sort(key=lambda j: (j.created_at, j.id))
        bound = queued_read_bound(snap.workspace_limits.get(ws, 0))
        kept.extend(jobs[:bound])
        held.extend(HeldBackJob(j.id, ws, workspace_active=True, not_before=None) for j in jobs[bound:])
    return replace(snap, queued=kept, held_back=held)


def same_plan(plan: TickPlan) -> TickPlan:
    """The plan with its reasons in job order (the cut queue lists its jobs in another)."""
    return replace(plan, pending=sorted(plan.pending, key=lambda c: c.job_id))


@st.composite
def fleets(draw: st.DrawFn) -> FleetSnapshot:
    n_ws = draw(st.integers(1, 4))
    queued: list[JobView] = []
    limits: dict[str, int] = {}
    running: dict[str, int] = {}
    for w in range(n_ws):
        ws = f"ws{w}"
        tier, weight = draw(st.sampled_from([(0, 0.5), (1, 1.0), (2, 2.0)]))
        usage = draw(st.sampled_from([0.0, 100.0, 5000.0]))
        if draw(st.booleans()) or w == 0:  # some workspaces are unknown to the limits table
            limits[ws] = draw(st.integers(0, 3))
        running[ws] = draw(st.integers(0, 4))
        for k in range(draw(st.integers(0, 9))):
            queued.append(
                job(
                    f"{ws}-j{k}",
                    ws,
                    tier=tier,
                    weight=weight,
                    usage=usage,
                    age_s=draw(st.sampled_from([0, 60, 60, 600, 3600])),  # ties in age
                    whole=draw(st.integers(0, 4)) == 0,
                    slots=draw(st.integers(1, 2)),
                )
            )
    machines = []
    for i in range(draw(st.integers(0, 5))):
        state = draw(st.sampled_from(["READY", "READY", "READY", "STOPPED", "BOOTING"]))
        busy = draw(st.sampled_from([frozenset(), frozenset({0}), frozenset({0, 1})]))
        machines.append(machine(f"m{i}", state=state, busy=busy if state == "READY" else frozenset()))
    draw(st.randoms()).shuffle(queued)
    return snapshot(queued=queued, machines=machines, limits=limits, running=running, pool_max=6)


@settings(max_examples=400, deadline=None)
@given(fleets())
def test_the_plan_from_the_cut_queue_is_the_plan_from_the_whole_queue(snap: FleetSnapshot) -> None:
    assert same_plan(decide(cut_to_bound(snap), POLICY)) == same_plan(decide(snap, POLICY))


def test_the_bound_is_the_cap_and_never_below_one() -> None:
    assert [queued_read_bound(n) for n in (0, 1, 2, 32)] == [1, 1, 2, 32]
