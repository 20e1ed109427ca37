"""The job and attempt lifecycle: what each cause of an attempt's end does to the attempt
and its job — retries left or spent, a cancel asked for, a job already final — written out
by hand here (DESIGN §6 and today's numbers), and the tables' shape: who may make each
move, nothing out of a final state, and the ledger's job routes saying what the code does."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.common.db.enums import TERMINAL_JOB_STATES, AttemptState, JobState, LedgerOutcome
from gpufleet.common.job_lifecycle import (
    ATTEMPT_TRANSITIONS,
    CHARGED_ATTEMPT_STATES,
    END_RULES,
    JOB_TRANSITIONS,
    LEDGER_ROUTE_OF_EFFECT,
    LEDGER_ROUTE_OF_WATCHDOG_MOVE,
    OUR_FAILURES,
    REQUEST_WATCHDOG_MOVES,
    UNCHARGED_ATTEMPT_STATES,
    EndCause,
    IllegalJobTransition,
    JobCounters,
    Mover,
    RetryPolicy,
    cause_of_report,
    check_attempt_move,
    check_cause,
    check_job_move,
    decide_attempt_end,
    lease_expiry_cause,
    table_rows,
)
from gpufleet.common.ledger import ROUTES, FailureClass, replace_cause, route
from gpufleet.common.outcome_policy import OutcomePolicy
from gpufleet.scheduler.settings import Settings

C = EndCause
A = AttemptState
J = JobState
POLICY = RetryPolicy(retry_backoff_s=10.0, lost_retry_backoff_s=30.0)

# cause -> (attempt ends, charged, budget spent on a retry or the job's final state,
#           first retry's back-off in seconds, who may end an attempt so)
EXPECTED: dict[EndCause, tuple[AttemptState, bool, str | JobState, float | None, set[Mover]]] = {
    C.SUCCEEDED: (A.SUCCEEDED, True, J.SUCCEEDED, None, {Mover.WORKER}),
    C.JOB_FAILED: (A.FAILED, True, "ordinary", 10.0, {Mover.WORKER}),
    C.RUNNER_TIMED_OUT: (A.TIMED_OUT, True, J.TIMED_OUT, None, {Mover.WORKER}),
    C.RUNNER_CANCELLED: (A.CANCELLED, True, J.CANCELLED, None, {Mover.WORKER}),
    # The runner died without a word: the job might have brought it down.
    C.INFRA_ERROR: (A.INFRA_ERROR, False, "patient", 30.0, {Mover.WORKER}),
    # The platform stopped a job running well (the lease fence): not the job's doing.
    C.DISRUPTED: (A.INFRA_ERROR, False, "disruption", 30.0, {Mover.WORKER}),
    # The job never started.
    C.SLOT_NOT_CLOSED: (A.INFRA_ERROR, False, "disruption", 30.0, {Mover.WORKER}),
    C.TIME_LIMIT: (A.TIMED_OUT, True, J.TIMED_OUT, None, {Mover.LIMITS}),
    # The machine went dark: a job that crashes its machine must not roam the fleet.
    C.LEASE_EXPIRED: (A.LOST, False, "patient", 30.0, {Mover.LEASE_EXPIRY}),
    # The lease ran out while the machine's agent still answered: its worker died.
    C.WORKER_LOST: (A.LOST, False, "disruption", 30.0, {Mover.LEASE_EXPIRY}),
    # Never started: the disruption budget, doubling from the scheduler's retry back-off.
    C.TAKEN_BACK: (A.INFRA_ERROR, False, "disruption", 10.0, {Mover.DISPATCH}),
    C.CANCEL_REQUESTED: (A.CANCELLED, True, J.CANCELLED, None, {Mover.CANCEL}),
    C.MACHINE_LOST: (A.LOST, False, "patient", 30.0, {Mover.MACHINE_LOSS}),
    # The cloud's own reason (pre-empted, spot-stopped, gone from its list).
    C.RECLAIMED: (A.LOST, False, "disruption", 30.0, {Mover.MACHINE_LOSS}),
    # NVML's finding: hardware.
    C.GPU_FAULT: (A.INFRA_ERROR, False, "disruption", 30.0, {Mover.GPU_HEALTH, Mover.MACHINE_LOSS}),
}


def job(
    *,
    state: JobState = J.RUNNING,
    failures: int = 0,
    losses: int = 0,
    cancel: bool = False,
    disruptions: int = 0,
) -> JobCounters:
    return JobCounters(
        state=state,
        failure_retries_used=failures,
        lost_retries_used=losses,
        retry_budget=2,
        lost_retry_budget=5,
        cancel_requested=cancel,
        disruptions_used=disruptions,
    )


def test_every_cause_is_written_out_here() -> None:
    assert set(EXPECTED) == set(EndCause) == set(END_RULES)


@pytest.mark.parametrize("cause", list(EndCause))
def test_the_attempt_ends_as_its_cause_says_and_is_charged_only_for_the_tenants_own(cause: EndCause) -> None:
    state, charged, _, _, by = EXPECTED[cause]
    update = decide_attempt_end(cause, job(), POLICY)
    assert (update.attempt_state, update.charged) == (state, charged)
    assert set(END_RULES[cause].by) == by
    assert (cause in OUR_FAILURES) == (not charged and update.requeued)


@pytest.mark.parametrize("cause", list(EndCause))
def test_with_retries_left(cause: EndCause) -> None:
    _, _, way, backoff, _ = EXPECTED[cause]
    update = decide_attempt_end(cause, job(failures=1, losses=2, disruptions=7), POLICY, exit_code=3)
    assert update.disruptions_used == (8 if way == "disruption" else 7)
    if way == "disruption":
        assert (update.job_state, update.failure_retries_used, update.lost_retries_used) == (J.QUEUED, 1, 2)
        # a fixed back-off, but a start that keeps failing doubles (capped at 2^5)
        assert update.backoff_s == (backoff * 32 if cause is C.TAKEN_BACK else backoff)
        assert update.message.endswith(
            "; requeued (disruption 8 of 20, not counted against its retries), not charged"
        )
    elif way == "ordinary":
        assert (update.job_state, update.failure_retries_used, update.lost_retries_used) == (J.QUEUED, 2, 2)
        assert update.backoff_s == backoff  # fixed: no doubling for the tenant's failures
        assert update.message == "attempt failed (exit 3); retry 2 of 2"
    elif way == "patient":
        assert (update.job_state, update.failure_retries_used, update.lost_retries_used) == (J.QUEUED, 1, 3)
        assert backoff is not None and update.backoff_s == backoff * 4  # the third loss: doubled twice
        assert update.message.endswith("; requeued (3 of 5), not charged")
    else:
        assert (update.job_state, update.failure_retries_used, update.lost_retries_used) == (way, 1, 2)
        assert update.backoff_s is None


@pytest.mark.parametrize("cause", list(EndCause))
def test_with_retries_spent(cause: EndCause) -> None:
    _, _, way, _, _ = EXPECTED[cause]
    update = decide_attempt_end(cause, job(failures=2, losses=5), POLICY, exit_code=1)
    if way == "disruption":  # the job's own budgets spent do not end it for a disruption
        assert (update.job_state, update.disruptions_used) == (J.QUEUED, 1)
        assert update.backoff_s is not None
        return
    if way == "ordinary":
        assert update.job_state is J.FAILED
        assert update.message == "failed (exit 1); retry budget spent"
    elif way == "patient":
        assert update.job_state is J.FAILED
        assert update.message.endswith("; lost-retry budget spent")
    else:
        assert update.job_state is way
    assert (update.failure_retries_used, update.lost_retries_used, update.backoff_s) == (2, 5, None)


@pytest.mark.parametrize("cause", list(EndCause))
def test_a_job_whose_cancel_was_asked_for_is_never_requeued(cause: EndCause) -> None:
    _, _, way, _, _ = EXPECTED[cause]
    update = decide_attempt_end(cause, job(cancel=True), POLICY)
    if way in ("ordinary", "patient", "disruption"):
        assert (update.job_state, update.message, update.backoff_s) == (J.CANCELLED, "cancelled", None)
        assert (update.failure_retries_used, update.lost_retries_used) == (0, 0)
    else:
        assert update.job_state is way


@pytest.mark.parametrize(("cause", "final"), list(itertools.product(EndCause, TERMINAL_JOB_STATES)))
def test_a_final_job_stays_final_whatever_its_attempt_says(cause: EndCause, final: JobState) -> None:
    update = decide_attempt_end(cause, job(state=final, failures=0, losses=0), POLICY)
    assert update.job_state is None
    assert (update.failure_retries_used, update.lost_retries_used, update.backoff_s) == (0, 0, None)
    assert update.attempt_state is EXPECTED[cause][0]  # the attempt still ends, charged as ever


def test_the_patient_back_off_doubles_from_the_lost_back_off() -> None:
    waits = [decide_attempt_end(C.MACHINE_LOST, job(losses=n), POLICY).backoff_s for n in range(5)]
    assert waits == [30.0, 60.0, 120.0, 240.0, 480.0]


def test_a_gpu_fault_is_our_failure_uncharged_and_spends_no_retry() -> None:
    update = decide_attempt_end(C.GPU_FAULT, job(failures=2, losses=5), POLICY)
    assert (update.charged, update.job_state, update.lost_retries_used, update.failure_retries_used) == (
        False,
        J.QUEUED,
        5,  # the patient budget is untouched, even when spent
        2,  # the tenant's own budget is untouched, even when spent
    )
    assert update.message == (
        "GPU fault on its machine; requeued (disruption 1 of 20, not counted against its retries), "
        "not charged"
    )


@pytest.mark.parametrize("cause", sorted(c for c in EndCause if EXPECTED[c][2] == "disruption"))
def test_a_disruption_ends_the_job_only_once_the_disruption_budget_is_spent(cause: EndCause) -> None:
    """A bound against a loop (a machine that refuses every start), never a judgement."""
    update = decide_attempt_end(cause, job(disruptions=19), POLICY)
    assert (update.job_state, update.disruptions_used) == (J.QUEUED, 20)
    update = decide_attempt_end(cause, job(disruptions=20), POLICY)
    assert (update.job_state, update.disruptions_used, update.backoff_s) == (J.FAILED, 20, None)
    assert update.message.endswith("; disruption budget spent")
    assert not update.charged


def test_the_patient_budget_ends_a_job_that_keeps_losing_its_machine_whatever_its_disruptions() -> None:
    update = decide_attempt_end(C.LEASE_EXPIRED, job(losses=5, disruptions=0), POLICY)
    assert update.job_state is J.FAILED
    assert update.message.endswith("; lost-retry budget spent")


def test_the_callers_words_name_the_end() -> None:
    update = decide_attempt_end(C.MACHINE_LOST, job(), POLICY, why="machine replaced (preempted, by sweeper)")
    assert update.message == "machine replaced (preempted, by sweeper); requeued (1 of 5), not charged"
    update = decide_attempt_end(C.CANCEL_REQUESTED, job(), POLICY, why="cancelled: not needed")
    assert update.message == "cancelled: not needed"


@pytest.mark.parametrize(
    ("cause", "by", "from_"), list(itertools.product(EndCause, Mover, [J.DISPATCHING, J.RUNNING]))
)
def test_each_decision_is_a_move_the_table_allows_for_its_movers_only(
    cause: EndCause, by: Mover, from_: JobState
) -> None:
    for counters in (job(state=from_), job(state=from_, failures=2, losses=5), job(state=from_, cancel=True)):
        update = decide_attempt_end(cause, counters, POLICY)
        assert update.job_state is not None
        if by in EXPECTED[cause][4]:
            check_cause(cause, by)
            check_job_move(from_, update.job_state, by)
            check_attempt_move(A.RUNNING, update.attempt_state, by)
        else:
            with pytest.raises(IllegalJobTransition):
                check_cause(cause, by)


def test_nothing_moves_out_of_a_final_state() -> None:
    assert not [k for k in JOB_TRANSITIONS if k[0] in TERMINAL_JOB_STATES]
    ended = set(AttemptState) - {A.STARTING, A.RUNNING}
    assert not [k for k in ATTEMPT_TRANSITIONS if k[0] in ended]


def test_the_starts_and_the_request_watchdogs_moves() -> None:
    assert JOB_TRANSITIONS[(J.QUEUED, J.DISPATCHING)] == {Mover.DISPATCH}
    assert JOB_TRANSITIONS[(J.DISPATCHING, J.RUNNING)] == {Mover.DISPATCH, Mover.WORKER}
    assert JOB_TRANSITIONS[(J.QUEUED, J.FAILED)] == {Mover.REQUEST_WATCHDOG}
    assert Mover.REQUEST_WATCHDOG in JOB_TRANSITIONS[(J.DISPATCHING, J.QUEUED)]
    assert ATTEMPT_TRANSITIONS[(A.STARTING, A.RUNNING)] == {Mover.DISPATCH, Mover.WORKER}
    # A watchdog never ends a running job, nor succeeds one.
    assert Mover.REQUEST_WATCHDOG not in JOB_TRANSITIONS[(J.RUNNING, J.FAILED)]
    assert (J.QUEUED, J.SUCCEEDED) not in JOB_TRANSITIONS


T = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("probe_after_renewal_s", "cause"),
    [
        (None, C.LEASE_EXPIRED),  # never probed: dark as far as anyone knows
        (-30.0, C.LEASE_EXPIRED),  # the last answer came before the last renewal
        (59.0, C.LEASE_EXPIRED),  # not yet overdue: the machine may have died just after
        (60.0, C.WORKER_LOST),  # up a whole overdue period after its worker went quiet
        (85.0, C.WORKER_LOST),
    ],
)
def test_a_lease_that_ran_out_on_a_machine_still_answering_is_its_workers_loss(
    probe_after_renewal_s: float | None, cause: EndCause
) -> None:
    renewed = T
    probe = None if probe_after_renewal_s is None else renewed + timedelta(seconds=probe_after_renewal_s)
    assert lease_expiry_cause(renewed + timedelta(seconds=90), 90.0, probe, overdue_s=60.0) is cause


def test_a_worker_report_names_its_cause() -> None:
    assert cause_of_report(A.SUCCEEDED) is C.SUCCEEDED
    assert cause_of_report(A.FAILED) is C.JOB_FAILED
    assert cause_of_report(A.TIMED_OUT) is C.RUNNER_TIMED_OUT
    assert cause_of_report(A.CANCELLED) is C.RUNNER_CANCELLED
    assert cause_of_report(A.INFRA_ERROR) is C.INFRA_ERROR
    assert cause_of_report(A.INFRA_ERROR, slot_not_closed=True) is C.SLOT_NOT_CLOSED
    assert cause_of_report(A.INFRA_ERROR, disrupted=True) is C.DISRUPTED
    # Only an INFRA_ERROR can be a disruption: a failure is the job's own, whatever is said.
    assert cause_of_report(A.FAILED, disrupted=True) is C.JOB_FAILED


# -- the ledger's job routes and the code never disagree ----------------------------------

_JOB_LEVEL = {LedgerOutcome.FAIL_JOB, LedgerOutcome.RETRY_SAME_MACHINE}


def test_every_class_an_attempts_end_records_routes_to_what_the_lifecycle_does() -> None:
    for cause, rule in END_RULES.items():
        if rule.ledger_class is not None:
            assert rule.ledger_class in {c.value for c in FailureClass}, cause
            assert route(rule.ledger_class) is LEDGER_ROUTE_OF_EFFECT[rule.job], cause


def test_every_request_watchdog_class_routes_to_what_its_move_does() -> None:
    for cls, (from_, to) in REQUEST_WATCHDOG_MOVES.items():
        assert Mover.REQUEST_WATCHDOG in JOB_TRANSITIONS[(from_, to)]
        assert route(cls) is LEDGER_ROUTE_OF_WATCHDOG_MOVE[to], cls


def test_every_job_level_route_is_a_move_the_lifecycle_makes() -> None:
    """No ledger class routes to a job outcome that no lifecycle move stands behind."""
    named = {r.ledger_class for r in END_RULES.values()} | set(REQUEST_WATCHDOG_MOVES)
    job_level = {c.value for c, outcome in ROUTES.items() if outcome in _JOB_LEVEL}
    assert job_level <= named, job_level - named


def test_a_lease_that_ran_out_routes_as_the_job_is_requeued() -> None:
    """The contradiction the lifecycle fixed: ``LEASE_EXPIRED -> NOTHING`` while the fleet
    tick requeues the job on the patient budget."""
    update = decide_attempt_end(C.LEASE_EXPIRED, job(), POLICY)
    assert update.job_state is J.QUEUED
    assert route(FailureClass.LEASE_EXPIRED) is LedgerOutcome.RETRY_SAME_MACHINE


def test_a_replaced_machines_attempts_end_as_a_loss_a_reclaim_or_a_gpu_fault() -> None:
    for cls in (FailureClass.PREEMPTED, FailureClass.SPOT_STOPPED, FailureClass.INSTANCE_GONE):
        assert replace_cause(cls) is C.RECLAIMED, cls
    for cls in (FailureClass.WENT_SILENT, FailureClass.MACHINE_STOPPED_ITSELF, FailureClass.BOOT_FAILED):
        assert replace_cause(cls) is C.MACHINE_LOST, cls
    assert replace_cause("gpu_fault") is C.GPU_FAULT


def test_the_default_back_offs_are_the_settings_defaults() -> None:
    """The simulator builds its RetryPolicy from these defaults: they must be the services'."""
    fields = Settings.model_fields
    assert RetryPolicy().retry_backoff_s == fields["retry_backoff_s"].default
    assert RetryPolicy().lost_retry_backoff_s == fields["lost_retry_backoff_s"].default
    assert RetryPolicy().lost_retry_backoff_s == OutcomePolicy().lost_retry_backoff_s
    assert RetryPolicy().disruption_budget == fields["disruption_budget"].default
    assert RetryPolicy().disruption_budget == OutcomePolicy().disruption_budget
    assert Settings().retry_policy() == RetryPolicy()


def test_the_design_doc_lists_every_cause_as_the_code_ends_it() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "jobs.md").read_text().splitlines()
    for cause, state, charged, _, _, slot in table_rows():
        line = next((x for x in doc if x.startswith(f"| `{cause}`")), "")
        assert f"| {state} | {charged} |" in line, cause
        assert line.endswith(f"| {slot} |"), cause


# The ends the control plane makes while the job's process may still run on the machine:
# its slots stay busy until the machine's worker reports the process gone.
HOLDS_SLOT = {C.TIME_LIMIT, C.LEASE_EXPIRED, C.WORKER_LOST, C.TAKEN_BACK, C.CANCEL_REQUESTED, C.GPU_FAULT}


@pytest.mark.parametrize("cause", list(EndCause))
def test_an_end_the_control_plane_makes_holds_the_slot_until_the_worker_lets_go(cause: EndCause) -> None:
    update = decide_attempt_end(cause, job(), POLICY)
    assert update.holds_slot is (cause in HOLDS_SLOT)
    # The worker's own word is that the process is gone; none of its causes holds.
    if END_RULES[cause].by == {Mover.WORKER}:
        assert not update.holds_slot


def test_an_attempts_end_state_alone_says_whether_it_is_charged() -> None:
    assert {A.LOST, A.INFRA_ERROR} == UNCHARGED_ATTEMPT_STATES
    assert {A.SUCCEEDED, A.FAILED, A.TIMED_OUT, A.CANCELLED} == CHARGED_ATTEMPT_STATES
