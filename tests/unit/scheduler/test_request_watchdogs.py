"""The scheduler's request-level watchdogs, decided from tables: what each catches, and
each reason it refuses — a job one second inside its bound included."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.scheduler.watchdogs import no_consumer, paid_wait, queue_wait, stuck_dispatch

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("waited_s", "deadline_s", "fails"),
    [
        (3601, 3600, True),  # one second past
        (3599, 3600, False),  # one second inside
        (3600, 3600, False),  # exactly at the deadline: still waits
        (86_401, 86_400, True),  # the default deadline
        (10, 0.5, True),  # a kind with a short deadline
    ],
)
def test_queue_wait_fails_only_past_the_kinds_deadline(
    waited_s: float, deadline_s: float, fails: bool
) -> None:
    job = queue_wait.QueuedJob("j1", "clip", ago(waited_s), deadline_s)
    expired = queue_wait.decide(NOW, [job])
    assert [e.job.job_id for e in expired] == (["j1"] if fails else [])
    if fails:
        assert f"{deadline_s:g} s" in expired[0].message and "not charged" in expired[0].message


def test_queue_wait_judges_each_job_by_its_own_kind() -> None:
    jobs = [
        queue_wait.QueuedJob("film", "film", ago(7200), 4 * 3600),
        queue_wait.QueuedJob("clip", "clip", ago(7200), 3600),
    ]
    assert [e.job.job_id for e in queue_wait.decide(NOW, jobs)] == ["clip"]


PAID = dict(workspace_id="w", plan_id="studio", rate_micros=1_000_000)


@pytest.mark.parametrize(
    ("job", "opens", "refusal"),
    [
        (paid_wait.WaitingJob("j", **PAID, waiting_since=ago(1801), already_opened=False), True, None),  # type: ignore[arg-type]
        (
            paid_wait.WaitingJob("j", **PAID, waiting_since=ago(1799), already_opened=False),  # type: ignore[arg-type]
            False,
            "NOT_WAITING_LONG_ENOUGH",
        ),
        (
            paid_wait.WaitingJob("j", **PAID, waiting_since=ago(7200), already_opened=True),  # type: ignore[arg-type]
            False,
            "ALREADY_OPENED",
        ),
        (
            paid_wait.WaitingJob("j", "w", "free", 0, ago(7200), False),
            False,
            "FREE_PLAN",
        ),
    ],
)
def test_paid_wait_opens_once_for_a_paid_job_past_the_threshold(
    job: paid_wait.WaitingJob, opens: bool, refusal: str | None
) -> None:
    decision = paid_wait.decide(NOW, [job], paid_wait.PaidWaitPolicy())
    assert [j.job_id for j in decision.open] == (["j"] if opens else [])
    assert decision.refusals == ({refusal: 1} if refusal else {})


@pytest.mark.parametrize(
    ("job", "resets", "refusal"),
    [
        (stuck_dispatch.DispatchingJob("j", ago(301), 0), True, None),
        (stuck_dispatch.DispatchingJob("j", ago(299), 0), False, "INSIDE_BOUND"),
        # The dispatch deadline owns a job whose attempt is still starting, however old.
        (stuck_dispatch.DispatchingJob("j", ago(3600), 1), False, "ATTEMPT_IN_FLIGHT"),
    ],
)
def test_stuck_dispatch_resets_only_a_dispatch_nothing_is_doing(
    job: stuck_dispatch.DispatchingJob, resets: bool, refusal: str | None
) -> None:
    decision = stuck_dispatch.decide(NOW, [job], stuck_dispatch.StuckDispatchPolicy())
    assert [j.job_id for j in decision.reset] == (["j"] if resets else [])
    assert decision.refusals == ({refusal: 1} if refusal else {})


SIM = no_consumer.OfferingSupply("sim-l4", "SIM", "sim-1")
Pool = no_consumer.PoolSupply
AWS = no_consumer.OfferingSupply("aws-l4", "AWS", "us-east-1")


@pytest.mark.parametrize(
    ("pool", "served", "halted", "fleet_ceiling", "fails_with", "refusal"),
    [
        # A pool with one usable offering is served (the near miss beside an unrun one).
        (Pool("p", 4, 0, (AWS, SIM)), {"sim-l4"}, set(), 8, None, "HAS_USABLE_OFFERING"),
        (Pool("p", 4, 0, (AWS,)), {"sim-l4"}, set(), 8, "AWS, which the provisioner", None),
        (
            no_consumer.PoolSupply("p", 4, 0, (SIM,)),
            {"sim-l4"},
            {("SIM", "sim-1")},
            8,
            "sim-1 is halted",
            None,
        ),
        (Pool("p", 0, 0, (SIM,)), {"sim-l4"}, set(), 8, "ceiling is 0", None),
        (Pool("p", 4, 0, (SIM,)), {"sim-l4"}, set(), 0, "MAX_RUNNING_MACHINES", None),
        (Pool("p", 4, 0, ()), {"sim-l4"}, set(), 8, "has no offering", None),
        # A machine of its own (running, stopped or registered) serves it whatever else holds.
        (Pool("p", 0, 1, (AWS,)), {"sim-l4"}, set(), 0, None, "HAS_MACHINE"),
        # Until the provisioner's offerings are read, nothing is concluded.
        (Pool("p", 4, 0, (AWS,)), None, set(), 8, None, "PROVIDERS_UNKNOWN"),
    ],
)
def test_no_consumer_fails_a_pool_nothing_can_serve_and_names_why(
    pool: no_consumer.PoolSupply,
    served: set[str] | None,
    halted: set[tuple[str, str]],
    fleet_ceiling: int,
    fails_with: str | None,
    refusal: str | None,
) -> None:
    decision = no_consumer.decide(
        {"p": ["j1", "j2"]},
        {"p": pool},
        None if served is None else frozenset(served),
        frozenset(halted),
        fleet_ceiling,
    )
    if fails_with is None:
        assert decision.fail == {} and decision.refusals == {refusal: 2}
    else:
        assert set(decision.fail) == {"j1", "j2"} and fails_with in decision.fail["j1"]


def test_no_consumer_fails_a_job_whose_pool_is_not_in_the_catalogue() -> None:
    decision = no_consumer.decide({"gone": ["j"]}, {}, frozenset(), frozenset(), 8)
    assert decision.fail == {"j": "the pool is not in the catalogue"}
