"""The fleet tick's requeue-after (tick/wake.py) checked against the decision itself: over
seeded random fleets — machines ready, booting, stopped, draining, their workers fresh or
going stale, dispatch and start back-offs, live attempts near their lease and time limit,
shorts and films waiting, held-back jobs — the decision at every instant before
``next_wake`` is the decision now (what it does: scale, assignments, ends, drains,
releases, pool clocks, pins, and each waiting job's reason), and at the wake it often is
not. A gate missing from the list fails the first half; a wake that never comes before a
change the second."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet.scheduler.tick.decide import decide
from gpufleet.scheduler.tick.model import (
    AttemptView,
    FleetSnapshot,
    HeldBackJob,
    JobView,
    MachineView,
    OfferingView,
    Policy,
    PoolView,
    TickPlan,
)
from gpufleet.scheduler.tick.wake import next_wake
from tests.unit.scheduler.fleet_views import machine

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
FRESH_S = 60.0


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def _fleet(rng: random.Random) -> tuple[FleetSnapshot, Policy]:
    machines: list[MachineView] = []
    attempts: list[AttemptView] = []
    films = [f"film-{i}" for i in range(rng.randint(0, 2))]
    for i in range(rng.randint(0, 5)):
        state = rng.choice(["READY", "READY", "BOOTING", "STOPPED", "DRAINING", "PROVISIONING"])
        mid = f"m{i}"
        busy = frozenset(s for s in range(2) if state in ("READY", "DRAINING") and rng.random() < 0.5)
        for slot in sorted(busy):
            whole = rng.random() < 0.2
            attempts.append(
                AttemptView(
                    id=f"a-{mid}-{slot}",
                    job_id=f"j-{mid}-{slot}",
                    machine_id=mid,
                    state="RUNNING",
                    started_at=NOW - _s(rng.uniform(0, 4000)),
                    lease_expires_at=NOW + _s(rng.uniform(-30, 120)),
                    slots=2 if whole else 1,
                    time_limit_s=3600.0,
                    expected_s=rng.choice([0.0, 600.0, 1800.0]),
                    whole_machine=whole,
                )
            )
        machines.append(
            machine(
                mid,
                state,
                intent="STOPPED" if state == "STOPPED" else "RUNNING",
                lost=rng.random() < 0.1,
                slots=2,
                busy_slots=busy,
                worker_report_at=None
                if state in ("STOPPED", "PROVISIONING")
                else NOW - _s(rng.uniform(0, 90)),
                hourly_price_micros=rng.choice([700_000, 1_000_000]),
                backoff_until=NOW + _s(rng.uniform(-60, 120)) if rng.random() < 0.3 else None,
                dispatch_backoff_until=NOW + _s(rng.uniform(-60, 120)) if rng.random() < 0.3 else None,
                earmarked_for=rng.choice(films) if films and state == "DRAINING" else None,
                offering_id="cheap",
                state_changed_at=NOW - _s(rng.uniform(0, 600)),
            )
        )
    queued = [
        JobView(
            id=f"q{i}" if i >= len(films) else films[i],
            workspace_id=rng.choice(["ws1", "ws2"]),
            pool_id="l4",
            kind_id="film" if i < len(films) else "short",
            slots_needed=2 if i < len(films) else 1,
            whole_machine=i < len(films),
            tier=rng.choice([0, 1]),
            weight=1.0,
            created_at=NOW - _s(rng.uniform(0, 3000)),
            usage=rng.uniform(0, 5000),
            waiting_since=NOW - _s(rng.uniform(0, 1000)),
            queue_wait_deadline_s=rng.choice([0.0, 900.0, 1800.0]),
        )
        for i in range(len(films) + rng.randint(0, 4))
    ]
    held = [
        HeldBackJob(f"h{i}", "ws1", True, NOW + _s(rng.uniform(1, 200)), NOW - _s(100), 600.0)
        for i in range(rng.randint(0, 1))
    ]
    snapshot = FleetSnapshot(
        now=NOW,
        queued=queued,
        running_per_workspace={},
        workspace_limits={"ws1": 10, "ws2": 10},
        machines=machines,
        pools={"l4": PoolView(id="l4", slots_per_machine=2, max_machines=rng.randint(2, 6))},
        offerings=[
            OfferingView("cheap", "l4", 1, "LOCAL", "r", "z", 2, "ON_DEMAND", 500_000),
            OfferingView("dear", "l4", 0, "LOCAL", "r", "z", 2, "ON_DEMAND", 900_000),
        ],
        live_attempts=attempts,
        held_back=held,
    )
    return snapshot, Policy(max_running_machines=rng.randint(2, 6), worker_fresh_s=FRESH_S)


def _what_it_does(plan: TickPlan) -> tuple[Any, ...]:
    """The plan's acts and each waiting job's reason (not its words or expected time)."""
    return (
        plan.scale,
        plan.assignments,
        sorted(plan.expired_leases),
        sorted(plan.over_limit),
        [(d.machine_id, d.job_id) for d in plan.drains],
        [(r.machine_id, r.job_id) for r in plan.releases],
        dict(plan.film_waits),
        plan.pool_clocks,
        plan.warm_pins,
        [(p.job_id, p.pending.reason if p.pending else None) for p in plan.pending],
    )


def test_nothing_the_tick_does_changes_before_its_wake() -> None:
    rng = random.Random(2612)
    changed_at_wake = 0
    for case in range(400):
        snapshot, policy = _fleet(rng)
        now_plan = decide(snapshot, policy)
        wake = next_wake(snapshot, policy)
        assert wake is None or wake > NOW, case
        horizon = wake if wake is not None else NOW + timedelta(days=2)
        instants = [NOW + (horizon - NOW) * rng.random() for _ in range(4)]
        instants.append(horizon - timedelta(microseconds=1))
        for t in instants:
            later = decide(replace(snapshot, now=t), policy)
            assert _what_it_does(later) == _what_it_does(now_plan), (case, t - NOW)
        if wake is not None and _what_it_does(decide(replace(snapshot, now=wake), policy)) != _what_it_does(
            now_plan
        ):
            changed_at_wake += 1
    # The wakes are not idle guesses: many of them are where the decision turns.
    assert changed_at_wake > 50, changed_at_wake


def test_a_fleet_with_no_clock_in_it_never_wakes() -> None:
    """No machine, attempt or waiting job with a time that can pass: nothing to wake for."""
    snapshot = FleetSnapshot(
        now=NOW,
        queued=[],
        running_per_workspace={},
        workspace_limits={},
        machines=[],
        pools={"l4": PoolView(id="l4", slots_per_machine=2, max_machines=2)},
        offerings=[],
        live_attempts=[],
    )
    assert next_wake(snapshot, Policy(max_running_machines=2, worker_fresh_s=FRESH_S)) is None


def test_a_film_waiting_wakes_when_a_cheaper_machines_jobs_are_due_to_end() -> None:
    """The film drains the machine whose jobs end soonest (every end already past counting
    as now), then the cheapest: once the cheaper machine's jobs are due to end too, it is
    the one. That instant is the wake, well before any worker could go stale."""

    def busy(mid: str, price: int, ends_in_s: float) -> tuple[MachineView, AttemptView]:
        view = machine(
            mid, slots=2, busy_slots=frozenset({0, 1}), worker_report_at=NOW, hourly_price_micros=price
        )
        attempt = AttemptView(
            id=f"a-{mid}",
            job_id=f"j-{mid}",
            machine_id=mid,
            state="RUNNING",
            started_at=NOW - _s(600),
            lease_expires_at=NOW + _s(300),
            slots=2,
            time_limit_s=3600.0,
            expected_s=600.0 + ends_in_s,
        )
        return view, attempt

    dear, dear_job = busy("m-dear", 1_000_000, -10)  # its jobs were due 10 s ago
    cheap, cheap_job = busy("m-cheap", 700_000, 20)
    film = JobView("film", "ws1", "l4", "film", 2, True, 1, 1.0, NOW - _s(60), 0.0)
    snapshot = FleetSnapshot(
        now=NOW,
        queued=[film],
        running_per_workspace={},
        workspace_limits={"ws1": 10},
        machines=[dear, cheap],
        pools={"l4": PoolView(id="l4", slots_per_machine=2, max_machines=2)},
        offerings=[],
        live_attempts=[dear_job, cheap_job],
    )
    policy = Policy(max_running_machines=2, worker_fresh_s=FRESH_S)
    plan = decide(snapshot, policy)
    assert [d.machine_id for d in plan.drains] == ["m-dear"]
    assert next_wake(snapshot, policy) == NOW + _s(20)
    later = decide(replace(snapshot, now=NOW + _s(21)), policy)
    assert [d.machine_id for d in later.drains] == ["m-cheap"]
