"""The assign step's fair share within one tick, and its capacity index against the plain
scan it replaced."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpufleet.scheduler.tick.decide import assign, eligible_demand, healthy
from gpufleet.scheduler.tick.model import Assignment, FleetSnapshot, JobView, MachineView, Policy
from tests.unit.scheduler.test_decide import NOW, job, machine, snapshot

HOUR = 3600.0


def per_workspace(assignments: list[Assignment], jobs: list[JobView]) -> list[str]:
    ws = {j.id: j.workspace_id for j in jobs}
    return [ws[a.job_id] for a in assignments]


# Three workspaces, four jobs each, eight free slots given out in one tick. The quantum a
# slot is charged within the tick is 900 slot-seconds. Usage and weights are in
# slot-seconds over the window; the seed's order is tier, then usage / weight, then age.
FAIR_SHARE_CASES = [
    pytest.param(
        # No history anywhere: the slots go round, oldest workspace first at each level.
        {"a": (0.0, 1.0), "b": (0.0, 1.0), "c": (0.0, 1.0)},
        ["a", "b", "c", "a", "b", "c", "a", "b"],
        id="equal-usage-round-robin",
    ),
    pytest.param(
        # b used 2 quanta, c 4: a takes two slots to catch up with b, then wins the tie on
        # age; c waits until a and b have caught up with it (a runs out of jobs first).
        {"a": (0.0, 1.0), "b": (1800.0, 1.0), "c": (3600.0, 1.0)},
        ["a", "a", "a", "b", "a", "b", "b", "c"],
        id="least-used-first-until-caught-up",
    ),
    pytest.param(
        # c's plan weighs 4: its 3600 slot-seconds count as 900, so it ties a's first
        # charged slot and, per slot, pays a quarter of what a pays.
        {"a": (0.0, 1.0), "b": (0.0, 1.0), "c": (3600.0, 4.0)},
        ["a", "b", "a", "b", "c", "c", "c", "c"],
        id="weight-divides-usage",
    ),
    pytest.param(
        # Heavy history for a: it gets nothing until the others have used the free slots.
        {"a": (100 * HOUR, 1.0), "b": (0.0, 1.0), "c": (0.0, 1.0)},
        ["b", "c", "b", "c", "b", "c", "b", "c"],
        id="heavy-user-waits",
    ),
]


@pytest.mark.parametrize(("usage", "expected"), FAIR_SHARE_CASES)
def test_fair_share_is_re_evaluated_as_slots_are_given_out(
    usage: dict[str, tuple[float, float]], expected: list[str]
) -> None:
    # Age breaks ties: a's jobs are the oldest, then b's, then c's.
    jobs = [
        job(f"{ws}{n}", ws, usage=used, weight=weight, age_s=1000 - 10 * i - n)
        for i, (ws, (used, weight)) in enumerate(usage.items())
        for n in range(4)
    ]
    machines = [machine(f"m{i}") for i in range(4)]  # 4 x 2 = 8 free slots
    snap = snapshot(queued=jobs, machines=machines, limits={"a": 10, "b": 10, "c": 10})
    policy = Policy(max_running_machines=4, worker_fresh_s=60, fair_share_quantum_s=900.0)
    got = assign(snap, policy, eligible_demand(snap))
    assert per_workspace(got, jobs) == expected


def test_higher_tier_takes_every_slot_it_can_use_first() -> None:
    jobs = [job(f"lo{n}", "lo", tier=0, age_s=100 + n) for n in range(3)] + [
        job(f"hi{n}", "hi", tier=2, usage=50 * HOUR) for n in range(3)
    ]
    snap = snapshot(queued=jobs, machines=[machine("m0"), machine("m1")], limits={"lo": 9, "hi": 9})
    got = assign(snap, Policy(max_running_machines=4, worker_fresh_s=60), eligible_demand(snap))
    assert per_workspace(got, jobs) == ["hi", "hi", "hi", "lo"]


def test_without_a_quantum_the_order_is_the_static_fair_share_order() -> None:
    jobs = [
        job(f"{ws}{n}", ws, usage=u, age_s=100 - n) for ws, u in (("a", 0.0), ("b", 10.0)) for n in range(3)
    ]
    snap = snapshot(queued=jobs, machines=[machine("m0"), machine("m1")], limits={"a": 9, "b": 9})
    policy = Policy(max_running_machines=4, worker_fresh_s=60, fair_share_quantum_s=0.0)
    got = assign(snap, policy, eligible_demand(snap))
    assert [a.job_id for a in got] == [j.id for j in eligible_demand(snap)][:4]


def plain_scan(snap: FleetSnapshot, policy: Policy, demand: list[JobView]) -> list[Assignment]:
    """The assign step as it was: every machine looked at for every job (the reference)."""
    free = {m.id: m.free_slots for m in snap.machines if healthy(m, snap, policy)}
    by_id = {m.id: m for m in snap.machines}
    out = []
    for j in demand:
        fits = [
            by_id[mid]
            for mid, slots in free.items()
            if by_id[mid].pool_id == j.pool_id
            and (len(slots) == by_id[mid].slots if j.whole_machine else len(slots) >= j.slots_needed)
        ]
        if not fits:
            continue
        best = min(fits, key=lambda m: (len(free[m.id]), m.hourly_price_micros, m.id))
        take = tuple(free[best.id][: (best.slots if j.whole_machine else j.slots_needed)])
        free[best.id] = [s for s in free[best.id] if s not in take]
        out.append(Assignment(j.id, best.id, take))
    return out


@pytest.mark.parametrize("seed", range(25))
def test_the_capacity_index_picks_what_a_full_scan_picks(seed: int) -> None:
    rng = random.Random(seed)
    machines: list[MachineView] = []
    for i in range(rng.randint(1, 40)):
        slots = rng.choice([1, 2, 4, 8])
        busy = frozenset(s for s in range(slots) if rng.random() < 0.4)
        m = machine(f"m{i:02d}", slots=slots, busy=busy, price=rng.choice([400_000, 800_000, 1_200_000]))
        if rng.random() < 0.3:
            m = replace(m, pool_id="a100")
        if rng.random() < 0.1:
            m = replace(m, cordoned=True)
        if rng.random() < 0.1:
            m = replace(m, dispatch_backoff_until=NOW.replace(hour=13))
        machines.append(m)
    jobs = []
    for n in range(rng.randint(1, 120)):
        whole = rng.random() < 0.15
        j = job(f"j{n:03d}", f"ws{rng.randint(0, 9)}", whole=whole, slots=rng.choice([1, 1, 2, 3]), age_s=n)
        if whole:
            j = replace(j, slots_needed=0)
        if rng.random() < 0.3:
            j = replace(j, pool_id="a100")
        jobs.append(j)
    snap = snapshot(queued=jobs, machines=machines, limits={f"ws{i}": 100 for i in range(10)})
    policy = Policy(max_running_machines=40, worker_fresh_s=60, fair_share_quantum_s=0.0)
    demand = eligible_demand(snap)
    assert assign(snap, policy, demand) == plain_scan(snap, policy, demand)
