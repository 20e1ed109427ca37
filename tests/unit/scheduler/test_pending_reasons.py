"""Why a queued job waits, as the fleet tick's pure decision says it: each PendingReason from
a table of fleet shapes, the expected ready time of the machine on its way, the deadline
near, and what is written (only a reason that changed; an event only when the reason
itself did)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import pytest

from gpufleet.scheduler.tick.boot_times import BootTimes
from gpufleet.scheduler.tick.decide import decide
from gpufleet.scheduler.tick.model import (
    FleetSnapshot,
    HeldBackJob,
    Pending,
    PendingChange,
    Policy,
    TickPlan,
)
from gpufleet.scheduler.tick.pending import R, ready_after
from tests.unit.scheduler.test_decide import NOW, POLICY, job, machine, snapshot
from tests.unit.scheduler.test_films import FULL, running, two_full_machines

BOOT = timedelta(seconds=POLICY.typical_boot_s)


def held(jid: str = "j", *, active: bool = True, not_before: datetime | None = None) -> HeldBackJob:
    return HeldBackJob(jid, "ws1", workspace_active=active, not_before=not_before)


@dataclass(frozen=True)
class Case:
    snap: FleetSnapshot
    reason: str
    words: str
    ready_at: datetime | None = None
    policy: Policy = POLICY
    job_id: str = "j"


def full_pool(pool_max: int = 1, **kw: object) -> FleetSnapshot:
    """One machine, both slots busy; ``j`` waits."""
    return snapshot(queued=[job("j")], machines=[machine("m", busy=FULL)], pool_max=pool_max, **kw)  # type: ignore[arg-type]


def film_share_cap() -> FleetSnapshot:
    """Two machines, one already runs a film, a short waits: a second film may not drain."""
    return snapshot(
        queued=[job("j", "ws2", whole=True), job("short")],
        machines=[machine("film-m", busy=FULL), machine("short-m", busy=FULL)],
        attempts=[
            running("f", "film-m", started_s_ago=60, expected_s=7200, whole=True),
            running("s", "short-m", started_s_ago=60, expected_s=600),
        ],
        pool_max=2,
    )


CASES = {
    "workspace paused": Case(
        replace(snapshot(), held_back=[held(active=False)]), R.WORKSPACE_PAUSED, "workspace ws1 is paused"
    ),
    "dispatch back-off": Case(
        replace(snapshot(), held_back=[held(not_before=NOW + timedelta(seconds=30))]),
        R.DISPATCH_BACKOFF,
        "until 2026-06-01 12:00:30 UTC",
    ),
    "plan's limit: its workspace runs its cap": Case(
        snapshot(queued=[job("j")], limits={"ws1": 2}, running={"ws1": 2}),
        R.PLAN_CONCURRENCY_LIMIT,
        "workspace ws1 runs at most 2 job(s) at once",
    ),
    "plan's limit: older jobs of it take the places (held back)": Case(
        replace(snapshot(limits={"ws1": 2}), held_back=[held()]),
        R.PLAN_CONCURRENCY_LIMIT,
        "workspace ws1 runs at most 2 job(s) at once",
    ),
    "a machine is created for it": Case(
        snapshot(queued=[job("j")]), R.WAITING_FOR_CAPACITY, "a machine of pool l4 is on its way", NOW + BOOT
    ),
    "a stopped machine starts for it (its offering's learned boot)": Case(
        replace(
            snapshot(queued=[job("j")], machines=[machine("m", state="STOPPED", offering_id="cheap")]),
            typical_boot_s={"cheap": 90.0},
        ),
        R.WAITING_FOR_CAPACITY,
        "expected to take work at 2026-06-01 12:01:30 UTC",
        NOW + timedelta(seconds=90),
    ),
    "a machine boots for it: its state change plus the default boot": Case(
        snapshot(
            queued=[job("j")],
            machines=[machine("m", state="BOOTING", state_changed_at=NOW - timedelta(seconds=60))],
        ),
        R.WAITING_FOR_CAPACITY,
        "on its way",
        NOW + BOOT - timedelta(seconds=60),
    ),
    "a machine boots for it: since it was requested, the offering's learned boot": Case(
        replace(
            snapshot(
                queued=[job("j")],
                machines=[
                    machine(
                        "m",
                        state="BOOTING",
                        offering_id="cheap",
                        state_changed_at=NOW - timedelta(seconds=10),
                    )
                ],
            ),
            arriving_since={"m": NOW - timedelta(seconds=60)},
            typical_boot_s={"cheap": 100.0},
        ),
        R.WAITING_FOR_CAPACITY,
        "on its way",
        NOW + timedelta(seconds=40),
    ),
    "a machine late to boot: the next whole boot": Case(
        snapshot(
            queued=[job("j")],
            machines=[
                machine("m", state="PROVISIONING", state_changed_at=NOW - BOOT - timedelta(seconds=20))
            ],
        ),
        R.WAITING_FOR_CAPACITY,
        "on its way",
        NOW + BOOT - timedelta(seconds=20),
    ),
    "its pool at its ceiling": Case(full_pool(), R.POOL_AT_CEILING, "pool l4 holds its most machines (1)"),
    "the fleet at its ceiling": Case(
        full_pool(pool_max=4),
        R.POOL_AT_CEILING,
        "the fleet runs its most machines (1)",
        policy=replace(POLICY, max_running_machines=1),
    ),
    # Decided one pool at a time (the simulator), the other pools' machines fill the same
    # fleet ceiling, and the reason names the fleet's ceiling, not what is left of it.
    "the fleet at its ceiling, with other pools' machines": Case(
        replace(full_pool(pool_max=8), room_held_elsewhere=3),
        R.POOL_AT_CEILING,
        "the fleet runs its most machines (4)",
        policy=replace(POLICY, max_running_machines=4),
    ),
    "every offering quarantined": Case(
        snapshot(queued=[job("j")], quarantined=frozenset({"cheap", "dear"})),
        R.OFFERING_QUARANTINED,
        "no machine can be added to pool l4: cheap is quarantined; dear is quarantined",
    ),
    "its offerings' region halted": Case(
        replace(snapshot(queued=[job("j")]), halted_regions=frozenset({("LOCAL", "r")})),
        R.OFFERING_QUARANTINED,
        "cheap is in a halted region (LOCAL r)",
    ),
    "no provider here serves its offerings": Case(
        replace(snapshot(queued=[job("j")]), served_offerings=frozenset()),
        R.OFFERING_QUARANTINED,
        "cheap is served by no provider here",
    ),
    "its pool lists no offering": Case(
        snapshot(queued=[job("j")], offerings=[]), R.OFFERING_QUARANTINED, "pool l4 lists no offering"
    ),
    "a film: films hold their share": Case(
        film_share_cap(), R.FILMS_SHARE_CAP, "films already hold 50% of pool l4's machines"
    ),
    "a film: a machine drains for it": Case(
        snapshot(queued=[job("j", whole=True)], **two_full_machines()),  # type: ignore[arg-type]
        R.WAITING_FOR_DRAIN,
        "machine m-short is draining for it; its jobs are expected to end by 2026-06-01 12:09:00 UTC",
    ),
    "a film: its machine drains": Case(
        snapshot(
            queued=[job("j", whole=True)],
            machines=[machine("m", state="DRAINING", earmarked_for="j", busy=frozenset({0}))],
            attempts=[running("a", "m", started_s_ago=60, expected_s=600)],
        ),
        R.WAITING_FOR_DRAIN,
        "machine m is draining for it",
    ),
    "a film: a machine is started for it": Case(
        snapshot(
            queued=[job("j", whole=True)],
            machines=[machine("busy", busy=frozenset({0})), machine("s", state="STOPPED")],
        ),
        R.WAITING_FOR_CAPACITY,
        "on its way",
        NOW + BOOT,
    ),
    "a film: its machine boots": Case(
        snapshot(
            queued=[job("j", whole=True)],
            machines=[
                machine("m", state="BOOTING", earmarked_for="j", state_changed_at=NOW - timedelta(seconds=30))
            ],
        ),
        R.WAITING_FOR_CAPACITY,
        "on its way",
        NOW + BOOT - timedelta(seconds=30),
    ),
    "a film: at the ceiling with nothing to drain": Case(
        snapshot(queued=[job("j", whole=True)], machines=[machine("sick", reported_s_ago=None)], pool_max=1),
        R.POOL_AT_CEILING,
        "pool l4 holds its most machines (1)",
    ),
    "near its queue-wait deadline: the first reason named": Case(
        snapshot(
            queued=[
                replace(job("j"), waiting_since=NOW - timedelta(seconds=3300), queue_wait_deadline_s=3600.0)
            ]
        ),
        R.QUEUE_WAIT_DEADLINE_NEAR,
        "a machine of pool l4 is on its way for it, expected to take work at 2026-06-01 12:03:00 UTC"
        " — and its queue-wait deadline is near: not started by 2026-06-01 12:05:00 UTC, it fails",
    ),
    "near its deadline while its workspace is paused": Case(
        replace(
            snapshot(),
            held_back=[
                replace(
                    held(active=False),
                    waiting_since=NOW - timedelta(hours=23),
                    queue_wait_deadline_s=86400.0,
                )
            ],
        ),
        R.QUEUE_WAIT_DEADLINE_NEAR,
        "workspace ws1 is paused; it starts once it is resumed — and its queue-wait deadline is near",
    ),
}


def reason_of(plan: TickPlan, job_id: str) -> Pending | None:
    (change,) = [c for c in plan.pending if c.job_id == job_id]
    return change.pending


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_each_reason_from_its_fleet_shape(case: Case) -> None:
    plan = decide(case.snap, case.policy)
    assert case.job_id not in {a.job_id for a in plan.assignments}
    pending = reason_of(plan, case.job_id)
    assert pending is not None
    assert (pending.reason, pending.ready_at) == (case.reason, case.ready_at)
    assert case.words in pending.message


def test_a_job_given_a_slot_gets_no_reason() -> None:
    plan = decide(snapshot(queued=[job("j")], machines=[machine("m")]), POLICY)
    assert [a.job_id for a in plan.assignments] == ["j"]
    assert plan.pending == []


def test_shorts_take_the_slots_on_their_way_soonest_first_then_wait_for_the_ceiling() -> None:
    # One machine boots (two slots, ready in 60 s); the pool may add one more (two slots):
    # five one-slot jobs, oldest first. The fifth finds the pool at its ceiling.
    jobs = [job(f"j{n}", age_s=100 - n) for n in range(5)]
    booting = machine("m", state="BOOTING", state_changed_at=NOW - BOOT + timedelta(seconds=60))
    plan = decide(snapshot(queued=jobs, machines=[booting], pool_max=2), POLICY)
    got = {c.job_id: c.pending for c in plan.pending}
    assert [(got[f"j{n}"].reason, got[f"j{n}"].ready_at) for n in range(4)] == [  # type: ignore[union-attr]
        (R.WAITING_FOR_CAPACITY, NOW + timedelta(seconds=60)),
        (R.WAITING_FOR_CAPACITY, NOW + timedelta(seconds=60)),
        (R.WAITING_FOR_CAPACITY, NOW + BOOT),
        (R.WAITING_FOR_CAPACITY, NOW + BOOT),
    ]
    assert got["j4"] is not None and got["j4"].reason == R.POOL_AT_CEILING


def test_a_reason_already_recorded_is_not_written_again() -> None:
    first = reason_of(decide(snapshot(queued=[job("j")]), POLICY), "j")
    again = decide(snapshot(queued=[replace(job("j"), pending=first)]), POLICY)
    assert again.pending == []


def test_new_words_for_the_same_reason_are_written_without_an_event() -> None:
    old = Pending(R.WAITING_FOR_CAPACITY, "a machine of pool l4 is on its way for it", NOW)
    plan = decide(snapshot(queued=[replace(job("j"), pending=old)]), POLICY)
    (change,) = plan.pending
    assert change.pending is not None and change.pending.ready_at == NOW + BOOT
    assert change.reason_changed is False
    paused = Pending(R.WORKSPACE_PAUSED, "workspace ws1 is paused; it starts once it is resumed")
    plan = decide(snapshot(queued=[replace(job("j"), pending=paused)]), POLICY)
    assert [c.reason_changed for c in plan.pending] == [True]  # resumed: now a machine is on its way


def test_a_reason_that_no_longer_holds_is_cleared() -> None:
    # Its pool is gone from the catalogue: nothing the tick does for it says why it waits.
    stale = Pending(R.POOL_AT_CEILING, "pool gone holds its most machines (1)")
    plan = decide(snapshot(queued=[replace(job("j"), pool_id="gone", pending=stale)]), POLICY)
    assert plan.pending == [PendingChange("j", None, reason_changed=True)]


def test_a_held_back_job_already_told_is_left_alone() -> None:
    told = Pending(R.WORKSPACE_PAUSED, "workspace ws1 is paused; it starts once it is resumed")
    plan = decide(replace(snapshot(), held_back=[replace(held(active=False), pending=told)]), POLICY)
    assert plan.pending == []


@pytest.mark.parametrize(
    ("began_s_ago", "boot_s", "ready_in_s"),
    [(0, 180, 180), (60, 180, 120), (180, 180, 180), (200, 180, 160), (400, 180, 140), (10, 0.2, 1)],
)
def test_the_expected_ready_time_moves_a_whole_boot_at_a_time(
    began_s_ago: float, boot_s: float, ready_in_s: float
) -> None:
    began = NOW - timedelta(seconds=began_s_ago)
    assert ready_after(began, boot_s, NOW) == NOW + timedelta(seconds=ready_in_s)


def test_the_typical_boot_is_learned_from_the_machines_the_leader_saw_arrive() -> None:
    boots = BootTimes()
    t0 = NOW - timedelta(minutes=10)

    def see(state: str, at: datetime, mid: str = "m1") -> None:
        boots.saw([machine(mid, state=state, offering_id="cheap", state_changed_at=at)])

    see("PROVISIONING", t0)
    see("BOOTING", t0 + timedelta(seconds=40))
    assert boots.arriving_since() == {"m1": t0}  # since the request, not since the boot began
    see("READY", t0 + timedelta(seconds=150))
    assert boots.typical_s() == {"cheap": 150.0} and boots.arriving_since() == {}
    # A machine first seen already BOOTING counts from that change; one first seen READY
    # (it booted before this leader) teaches nothing.
    see("BOOTING", t0 + timedelta(seconds=200), "m2")
    see("READY", t0 + timedelta(seconds=300), "m2")
    see("READY", t0 + timedelta(seconds=999), "m3")
    assert boots.typical_s() == {"cheap": 125.0}  # the median of 150 and 100
