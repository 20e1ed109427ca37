"""The fleet tick's pure decisions, from tables of cases."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.scheduler.tick.decide import decide, eligible_demand, expected_cost_micros
from gpufleet.scheduler.tick.model import (
    Assignment,
    AttemptView,
    CreateMachine,
    FleetSnapshot,
    JobView,
    MachineView,
    OfferingView,
    Policy,
    PoolView,
    StartMachine,
)

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
POLICY = Policy(max_running_machines=4, worker_fresh_s=60)


def job(
    jid: str,
    ws: str = "ws1",
    *,
    tier: int = 1,
    usage: float = 0.0,
    weight: float = 1.0,
    age_s: float = 0,
    whole: bool = False,
    slots: int = 1,
) -> JobView:
    return JobView(
        id=jid,
        workspace_id=ws,
        pool_id="l4",
        kind_id="film" if whole else "short",
        slots_needed=2 if whole else slots,
        whole_machine=whole,
        tier=tier,
        weight=weight,
        created_at=NOW - timedelta(seconds=age_s),
        usage=usage,
    )


def machine(
    mid: str,
    *,
    state: str = "READY",
    busy: frozenset[int] = frozenset(),
    slots: int = 2,
    price: int = 1_000_000,
    reported_s_ago: float | None = 5,
    **kw: object,
) -> MachineView:
    base = MachineView(
        id=mid,
        pool_id="l4",
        state=state,
        intent="RUNNING" if state != "STOPPED" else "STOPPED",
        origin="PROVISIONED",
        managed=True,
        lost=False,
        cordoned=False,
        slots=slots,
        busy_slots=busy,
        worker_report_at=None if reported_s_ago is None else NOW - timedelta(seconds=reported_s_ago),
        hourly_price_micros=price,
        capacity_type="ON_DEMAND",
        preemption_count=0,
        spot_seconds=0.0,
        backoff_until=None,
        agent_address="127.0.0.1:1",
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def snapshot(
    *,
    queued: list[JobView] = (),
    machines: list[MachineView] = (),  # type: ignore[assignment]
    limits: dict[str, int] | None = None,
    running: dict[str, int] | None = None,
    offerings: list[OfferingView] | None = None,
    attempts: list[AttemptView] = (),  # type: ignore[assignment]
    quarantined: frozenset[str] = frozenset(),
    pool_max: int = 4,
) -> FleetSnapshot:
    return FleetSnapshot(
        now=NOW,
        queued=list(queued),
        running_per_workspace=running or {},
        workspace_limits=limits or {"ws1": 10, "ws2": 10},
        machines=list(machines),
        pools={"l4": PoolView(id="l4", slots_per_machine=2, max_machines=pool_max)},
        offerings=offerings
        if offerings is not None
        else [
            OfferingView(
                id="cheap",
                pool_id="l4",
                rank=1,
                provider="LOCAL",
                region="r",
                zone="z",
                slots=2,
                capacity_type="ON_DEMAND",
                hourly_price_micros=500_000,
            ),
            OfferingView(
                id="dear",
                pool_id="l4",
                rank=0,
                provider="LOCAL",
                region="r",
                zone="z",
                slots=2,
                capacity_type="ON_DEMAND",
                hourly_price_micros=900_000,
            ),
        ],
        live_attempts=list(attempts),
        quarantined_offerings=quarantined,
    )


def test_order_is_tier_then_fair_share_then_age() -> None:
    jobs = [
        job("old-heavy", "ws1", usage=1000, age_s=100),
        job("new-light", "ws2", usage=10, age_s=1),
        job("vip", "ws1", tier=2, usage=10**9),
        job("old-light", "ws2", usage=10, age_s=50),
    ]
    assert [j.id for j in eligible_demand(snapshot(queued=jobs))] == [
        "vip",
        "old-light",
        "new-light",
        "old-heavy",
    ]


def test_fair_share_divides_usage_by_plan_weight() -> None:
    heavy_but_weighted = job("a", "ws1", usage=300, weight=4.0)  # 75 per weight
    light = job("b", "ws2", usage=100, weight=1.0)
    assert [j.id for j in eligible_demand(snapshot(queued=[light, heavy_but_weighted]))] == ["a", "b"]


def test_plan_limit_caps_jobs_at_once() -> None:
    jobs = [job(f"j{i}", "ws1", age_s=10 - i) for i in range(4)]
    snap = snapshot(queued=jobs, limits={"ws1": 3}, running={"ws1": 1})
    assert [j.id for j in eligible_demand(snap)] == ["j0", "j1"]


@pytest.mark.parametrize(
    ("m", "assigned"),
    [
        (machine("m"), True),
        (machine("m", lost=True), False),
        (machine("m", cordoned=True), False),
        (machine("m", state="BOOTING"), False),
        (machine("m", state="DRAINING"), False),
        (machine("m", reported_s_ago=None), False),
        (machine("m", reported_s_ago=61), False),
        (machine("m", busy=frozenset({0, 1})), False),
    ],
)
def test_only_healthy_machines_with_free_slots_get_work(m: MachineView, assigned: bool) -> None:
    plan = decide(snapshot(queued=[job("j")], machines=[m]), POLICY)
    assert (plan.assignments == [Assignment("j", "m", (0,))]) is assigned


def test_busy_machine_is_packed_first_so_others_can_go_quiet() -> None:
    plan = decide(
        snapshot(queued=[job("j")], machines=[machine("idle"), machine("half", busy=frozenset({0}))]), POLICY
    )
    assert plan.assignments == [Assignment("j", "half", (1,))]


def test_film_needs_a_whole_free_machine() -> None:
    snap = snapshot(queued=[job("film", whole=True)], machines=[machine("half", busy=frozenset({0}))])
    plan = decide(snap, POLICY)
    assert plan.assignments == []
    # The machine created for it is earmarked: no short may take it.
    assert plan.scale == [CreateMachine(offering_id="cheap", pool_id="l4", for_job="film")]


def test_scale_prefers_a_stopped_machine_then_the_cheapest_offering() -> None:
    snap = snapshot(queued=[job("a"), job("b"), job("c")], machines=[machine("stopped", state="STOPPED")])
    plan = decide(snap, POLICY)
    assert plan.scale == [StartMachine("stopped"), CreateMachine(offering_id="cheap", pool_id="l4")]


def test_arriving_machines_count_as_supply() -> None:
    snap = snapshot(queued=[job("a"), job("b")], machines=[machine("booting", state="BOOTING")])
    assert decide(snap, POLICY).scale == []


@pytest.mark.parametrize(("pool_max", "ceiling", "expected"), [(1, 4, 1), (4, 2, 2), (4, 4, 3)])
def test_ceilings_cap_scale_up(pool_max: int, ceiling: int, expected: int) -> None:
    snap = snapshot(queued=[job(f"j{i}") for i in range(6)], pool_max=pool_max)
    assert len(decide(snap, Policy(max_running_machines=ceiling, worker_fresh_s=60)).scale) == expected


def test_quarantined_offering_is_skipped() -> None:
    snap = snapshot(queued=[job("a")], quarantined=frozenset({"cheap"}))
    assert decide(snap, POLICY).scale == [CreateMachine(offering_id="dear", pool_id="l4")]


def test_stopped_machine_in_backoff_is_not_started() -> None:
    m = machine("s", state="STOPPED", backoff_until=NOW + timedelta(seconds=5))
    assert decide(snapshot(queued=[job("a")], machines=[m]), POLICY).scale == [CreateMachine("cheap", "l4")]


def test_expected_cost_adds_preemption_risk() -> None:
    on_demand = expected_cost_micros(1_000_000, "ON_DEMAND", 0, 0, POLICY)
    quiet_spot = expected_cost_micros(400_000, "SPOT", 0, 100 * 3600, POLICY)
    flaky_spot = expected_cost_micros(400_000, "SPOT", 300, 100 * 3600, POLICY)
    assert quiet_spot < on_demand < flaky_spot


def attempt(aid: str, *, started_s_ago: float, lease_in_s: float, limit_s: float = 3600) -> AttemptView:
    return AttemptView(
        id=aid,
        job_id="j",
        machine_id="m",
        state="RUNNING",
        started_at=NOW - timedelta(seconds=started_s_ago),
        lease_expires_at=NOW + timedelta(seconds=lease_in_s),
        slots=1,
        time_limit_s=limit_s,
    )


def test_leases_and_time_limits() -> None:
    plan = decide(
        snapshot(
            attempts=[
                attempt("fresh", started_s_ago=10, lease_in_s=50),
                attempt("lost", started_s_ago=10, lease_in_s=-1),
                attempt("long", started_s_ago=3601, lease_in_s=50),
            ]
        ),
        POLICY,
    )
    assert plan.expired_leases == ["lost"]
    assert plan.over_limit == ["long"]


def test_a_machine_that_keeps_being_taken_back_waits_behind_a_cheaper_offering() -> None:
    preempted = machine(
        "spot", state="STOPPED", price=400_000, capacity_type="SPOT", preemption_count=1, spot_seconds=1800.0
    )
    quiet = machine("quiet", state="STOPPED", price=1_000_000)
    assert decide(snapshot(queued=[job("a")], machines=[preempted]), POLICY).scale == [
        CreateMachine(offering_id="cheap", pool_id="l4")
    ]
    # A quiet stopped machine still starts before any new one, even a cheaper one.
    assert decide(snapshot(queued=[job("a")], machines=[preempted, quiet]), POLICY).scale == [
        StartMachine("quiet")
    ]
    # With no offering left, the pre-empted machine is still better than nothing.
    assert decide(snapshot(queued=[job("a")], machines=[preempted], offerings=[]), POLICY).scale == [
        StartMachine("spot")
    ]


def test_a_machine_whose_start_failed_is_not_counted_as_arriving() -> None:
    failed = machine("m", state="STARTING", backoff_until=NOW + timedelta(seconds=60))
    assert decide(snapshot(queued=[job("a")], machines=[failed]), POLICY).scale == [
        CreateMachine("cheap", "l4")
    ]
    settled = replace(failed, backoff_until=NOW - timedelta(seconds=1))
    assert decide(snapshot(queued=[job("a")], machines=[settled]), POLICY).scale == []


def box(mid: str, *, reported_s_ago: float | None, **kw: object) -> MachineView:
    """A self-registered box (not ours: never started, stopped or destroyed by us)."""
    return machine(mid, reported_s_ago=reported_s_ago, origin="REGISTERED", managed=False, **kw)


@pytest.mark.parametrize(
    ("boxes", "creates"),
    [
        # Two boxes that registered and went silent (or never reported) fill nothing.
        ([box("dead-1", reported_s_ago=None), box("dead-2", reported_s_ago=3600)], 2),
        # Reporting boxes are capacity (here busy, so no job fits on them): the pool is full.
        (
            [
                box("live-1", reported_s_ago=5, busy=frozenset({0, 1})),
                box("live-2", reported_s_ago=5, busy=frozenset({0, 1})),
            ],
            0,
        ),
        # A cordoned box takes no job, so it holds no room either.
        (
            [
                box("cordoned", reported_s_ago=5, cordoned=True),
                box("live", reported_s_ago=5, busy=frozenset({0, 1})),
            ],
            1,
        ),
    ],
)
def test_a_registered_box_holds_room_in_its_pool_only_while_it_can_take_jobs(
    boxes: list[MachineView], creates: int
) -> None:
    snap = snapshot(queued=[job(f"j{i}") for i in range(4)], machines=boxes, pool_max=2)
    plan = decide(snap, POLICY)
    assert len([a for a in plan.scale if isinstance(a, CreateMachine)]) == creates
    assert not plan.assignments or all(a.machine_id.startswith("live") for a in plan.assignments)


def test_a_silent_machine_of_ours_still_holds_room_it_bills() -> None:
    snap = snapshot(
        queued=[job("a"), job("b")], machines=[machine("silent", reported_s_ago=None)], pool_max=1
    )
    assert decide(snap, POLICY).scale == []
