"""Films beside shorts, from tables: the earmark choice, the drain choice, the share cap
with shorts waiting and not, and the release of earmarks that no longer serve a film."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from gpufleet.scheduler.tick.decide import decide
from gpufleet.scheduler.tick.films import WAIT_EARMARK, WAIT_NO_MACHINE, WAIT_SHARE_CAP
from gpufleet.scheduler.tick.model import (
    Assignment,
    AttemptView,
    CreateMachine,
    Drain,
    MachineView,
    Policy,
    Release,
    StartMachine,
)
from tests.unit.scheduler.test_decide import NOW, POLICY, job, machine, snapshot

FULL = frozenset({0, 1})


def running(
    aid: str, mid: str, *, started_s_ago: float, expected_s: float, whole: bool = False
) -> AttemptView:
    return AttemptView(
        id=aid,
        job_id=f"job-{aid}",
        machine_id=mid,
        state="RUNNING",
        started_at=NOW - timedelta(seconds=started_s_ago),
        lease_expires_at=NOW + timedelta(seconds=60),
        slots=2 if whole else 1,
        time_limit_s=12_600,
        expected_s=expected_s,
        whole_machine=whole,
    )


def two_full_machines(long_expected: float = 3 * 3600, short_expected: float = 600) -> dict[str, object]:
    """Four shorts fill two machines: two long on m-long, two short on m-short."""
    return {
        "machines": [machine("m-long", busy=FULL), machine("m-short", busy=FULL)],
        "attempts": [
            running("l1", "m-long", started_s_ago=60, expected_s=long_expected),
            running("l2", "m-long", started_s_ago=60, expected_s=long_expected),
            running("s1", "m-short", started_s_ago=60, expected_s=short_expected),
            running("s2", "m-short", started_s_ago=60, expected_s=short_expected),
        ],
        "pool_max": 2,
    }


# -- the drain choice -------------------------------------------------------------------


def test_at_the_ceiling_the_machine_whose_jobs_end_soonest_drains() -> None:
    plan = decide(snapshot(queued=[job("film", whole=True)], **two_full_machines()), POLICY)  # type: ignore[arg-type]
    assert plan.scale == []
    assert plan.assignments == []
    assert plan.drains == [Drain("m-short", "film", NOW - timedelta(seconds=60) + timedelta(seconds=600))]


@pytest.mark.parametrize(
    ("attempts", "drains"),
    [
        # Same kind, one started earlier: it ends first.
        (
            [
                running("a", "m-long", started_s_ago=100, expected_s=1200),
                running("b", "m-short", started_s_ago=900, expected_s=1200),
            ],
            "m-short",
        ),
        # A machine ends when its last job does, not its first.
        (
            [
                running("a", "m-long", started_s_ago=0, expected_s=60),
                running("b", "m-long", started_s_ago=0, expected_s=7200),
                running("c", "m-short", started_s_ago=0, expected_s=3600),
            ],
            "m-short",
        ),
        # Overdue jobs end "now" on both: the cheaper machine, then the id.
        (
            [
                running("a", "m-long", started_s_ago=9000, expected_s=60),
                running("b", "m-short", started_s_ago=9000, expected_s=60),
            ],
            "m-long",
        ),
    ],
)
def test_drain_choice_table(attempts: list[AttemptView], drains: str) -> None:
    snap = snapshot(
        queued=[job("film", whole=True)],
        machines=[machine("m-long", busy=frozenset({0})), machine("m-short", busy=frozenset({0}))],
        attempts=attempts,
        pool_max=2,
    )
    # m-long and m-short each have a free slot but no free whole machine.
    plan = decide(snap, POLICY)
    assert [d.machine_id for d in plan.drains] == [drains]


def test_no_drain_of_a_machine_that_cannot_take_work() -> None:
    sick = [
        machine("m1", busy=FULL, lost=True),
        machine("m2", busy=FULL, cordoned=True),
        machine("m3", busy=FULL, reported_s_ago=120),
        machine("m4", state="BOOTING"),
    ]
    plan = decide(snapshot(queued=[job("film", whole=True)], machines=sick, pool_max=4), POLICY)
    assert plan.drains == [] and plan.scale == []
    assert plan.film_waits[WAIT_NO_MACHINE] == 1


def test_two_films_never_drain_the_same_machine() -> None:
    films = [job("f1", whole=True, age_s=2), job("f2", whole=True, age_s=1)]
    plan = decide(snapshot(queued=films, **two_full_machines()), POLICY)  # type: ignore[arg-type]
    assert [(d.job_id, d.machine_id) for d in plan.drains] == [("f1", "m-short"), ("f2", "m-long")]


# -- the earmark choice -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("stopped", "started"),
    [
        # The cheapest stopped machine by expected cost an hour.
        (
            [
                machine("dear", state="STOPPED", price=900_000),
                machine("cheap", state="STOPPED", price=400_000),
            ],
            "cheap",
        ),
        # A spot machine that keeps being taken back costs more than its price.
        (
            [
                machine(
                    "spot",
                    state="STOPPED",
                    price=300_000,
                    capacity_type="SPOT",
                    preemption_count=5,
                    spot_seconds=3600,
                ),
                machine("od", state="STOPPED", price=450_000),
            ],
            "od",
        ),
    ],
)
def test_a_film_with_no_free_machine_earmarks_the_cheapest_stopped_machine(
    stopped: list[MachineView], started: str
) -> None:
    snap = snapshot(
        queued=[job("film", whole=True)], machines=[machine("busy", busy=frozenset({0})), *stopped]
    )
    plan = decide(snap, POLICY)
    assert plan.scale == [StartMachine(started, for_job="film")]
    assert plan.drains == []


def test_with_no_stopped_machine_the_film_earmarks_a_new_one() -> None:
    plan = decide(
        snapshot(queued=[job("film", whole=True)], machines=[machine("half", busy=frozenset({0}))]), POLICY
    )
    assert plan.scale == [CreateMachine("cheap", "l4", for_job="film")]


def test_a_film_waiting_for_its_machine_asks_for_nothing_more() -> None:
    snap = snapshot(
        queued=[job("film", whole=True)],
        machines=[
            machine("half", busy=frozenset({0})),
            machine("arriving", state="BOOTING", earmarked_for="film"),
        ],
    )
    plan = decide(snap, POLICY)
    assert plan.scale == [] and plan.drains == [] and plan.assignments == []
    assert plan.film_waits[WAIT_EARMARK] == 1


def test_no_short_takes_a_machine_held_for_a_film_nor_counts_it_as_arriving() -> None:
    held = machine("held", earmarked_for="film")
    snap = snapshot(
        queued=[job("short")], machines=[held, machine("boot", state="BOOTING", earmarked_for="f2")]
    )
    # Neither film is queued here, so both earmarks are stale and released ...
    plan = decide(snap, POLICY)
    assert {r.machine_id for r in plan.releases} == {"held", "boot"}
    assert plan.assignments == [Assignment("short", "held", (0,))]
    # ... with the films queued (the film's slot limit keeps it from starting here) the
    # short gets neither machine and a machine is bought for it.
    snap = snapshot(
        queued=[job("short"), job("film", "ws2", whole=True), job("f2", "ws2", whole=True)],
        machines=[
            replace(held, busy_slots=frozenset({0})),
            machine("boot", state="BOOTING", earmarked_for="f2"),
        ],
    )
    plan = decide(snap, POLICY)
    assert all(a.machine_id not in {"held", "boot"} for a in plan.assignments if a.job_id == "short")
    assert CreateMachine("cheap", "l4") in plan.scale


def test_the_film_starts_on_its_machine_once_ready_or_drained_and_wholly_free() -> None:
    for state in ("READY", "DRAINING"):
        snap = snapshot(
            queued=[job("short"), job("film", "ws2", whole=True)],
            machines=[machine("m", state=state, earmarked_for="film")],
        )
        plan = decide(snap, POLICY)
        assert plan.assignments == [Assignment("film", "m", (0, 1))], state
    # Still draining: nothing starts there.
    snap = snapshot(
        queued=[job("short"), job("film", "ws2", whole=True)],
        machines=[machine("m", state="DRAINING", earmarked_for="film", busy=frozenset({1}))],
    )
    assert decide(snap, POLICY).assignments == []


def test_a_film_takes_a_free_machine_that_appears_before_its_own() -> None:
    snap = snapshot(
        queued=[job("film", whole=True)],
        machines=[machine("free"), machine("arriving", state="BOOTING", earmarked_for="film")],
    )
    plan = decide(snap, POLICY)
    assert plan.assignments == [Assignment("film", "free", (0, 1))]


# -- the share cap ----------------------------------------------------------------------


def test_while_shorts_wait_films_hold_at_most_half_the_pool() -> None:
    # Two machines, one already runs a film, shorts wait: a second film may not drain.
    base = {
        "machines": [machine("film-m", busy=FULL), machine("short-m", busy=FULL)],
        "attempts": [
            running("f", "film-m", started_s_ago=60, expected_s=7200, whole=True),
            running("s", "short-m", started_s_ago=60, expected_s=600),
        ],
        "pool_max": 2,
    }
    plan = decide(snapshot(queued=[job("film2", "ws2", whole=True), job("short")], **base), POLICY)  # type: ignore[arg-type]
    assert plan.drains == [] and plan.scale == []
    assert plan.film_waits[WAIT_SHARE_CAP] == 1
    # No short waiting: no cap, the film drains the other machine.
    plan = decide(snapshot(queued=[job("film2", "ws2", whole=True)], **base), POLICY)  # type: ignore[arg-type]
    assert [d.machine_id for d in plan.drains] == ["short-m"]


@pytest.mark.parametrize(("shorts_wait", "film_runs"), [(True, False), (False, True)])
def test_a_pool_of_one_machine_runs_a_film_only_when_no_short_waits(
    shorts_wait: bool, film_runs: bool
) -> None:
    queued = [job("film", "ws2", whole=True, age_s=10)] + ([job("short")] if shorts_wait else [])
    plan = decide(snapshot(queued=queued, machines=[machine("only")], pool_max=1), POLICY)
    assert (Assignment("film", "only", (0, 1)) in plan.assignments) is film_runs
    if shorts_wait:
        assert plan.assignments == [Assignment("short", "only", (0,))]
        assert plan.film_waits[WAIT_SHARE_CAP] == 1


def test_the_share_is_configurable() -> None:
    base = two_full_machines()
    queued = [job("film", "ws2", whole=True), job("short")]
    assert decide(snapshot(queued=queued, **base), POLICY).drains != []  # type: ignore[arg-type]
    none = Policy(max_running_machines=4, worker_fresh_s=60, film_share=0.0)
    assert decide(snapshot(queued=queued, **base), none).drains == []  # type: ignore[arg-type]


def test_a_start_for_a_film_counts_the_machine_it_adds() -> None:
    # Zero live machines, shorts waiting: floor(0.5 * 1) = 0, so the first machine goes
    # to the shorts; with one live machine a second may start for the film.
    plan = decide(snapshot(queued=[job("film", "ws2", whole=True, age_s=5), job("short")]), POLICY)
    assert plan.scale == [CreateMachine("cheap", "l4")]
    assert plan.film_waits[WAIT_SHARE_CAP] == 1
    plan = decide(
        snapshot(
            queued=[job("film", "ws2", whole=True, age_s=5), job("short")], machines=[machine("m", busy=FULL)]
        ),
        POLICY,
    )
    assert CreateMachine("cheap", "l4", for_job="film") in plan.scale


# -- releases ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("machines", "queued", "released"),
    [
        # The film was cancelled (or failed, or started elsewhere): not queued any more.
        ([machine("m", state="DRAINING", busy=frozenset({0}), earmarked_for="gone")], [], [("m", "gone")]),
        # The machine left the running states, or cannot take work.
        ([machine("m", state="STOPPED", earmarked_for="film")], ["film"], [("m", "film")]),
        ([machine("m", state="STOPPING", earmarked_for="film")], ["film"], [("m", "film")]),
        ([machine("m", earmarked_for="film", lost=True)], ["film"], [("m", "film")]),
        ([machine("m", earmarked_for="film", cordoned=True)], ["film"], [("m", "film")]),
        # Two held for one film: the one furthest along is kept.
        (
            [
                machine("a", state="BOOTING", earmarked_for="film"),
                machine("b", state="DRAINING", busy=FULL, earmarked_for="film"),
            ],
            ["film"],
            [("a", "film")],
        ),
        # A film still waiting keeps its machine.
        ([machine("m", state="BOOTING", earmarked_for="film")], ["film"], []),
    ],
)
def test_release_table(
    machines: list[MachineView], queued: list[str], released: list[tuple[str, str]]
) -> None:
    plan = decide(snapshot(queued=[job(j, whole=True) for j in queued], machines=machines), POLICY)
    assert [(r.machine_id, r.job_id) for r in plan.releases] == released
    assert all(isinstance(r, Release) and r.why for r in plan.releases)


def test_a_paused_or_limited_film_releases_its_drain() -> None:
    # The workspace is at its plan's limit: the film cannot start, so its machine is not held idle.
    snap = snapshot(
        queued=[job("film", whole=True)],
        machines=[machine("m", state="DRAINING", earmarked_for="film")],
        limits={"ws1": 1},
        running={"ws1": 1},
    )
    plan = decide(snap, POLICY)
    assert [(r.machine_id, r.job_id) for r in plan.releases] == [("m", "film")]
    assert plan.assignments == []
