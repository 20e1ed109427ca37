"""A machine's dispatch back-off, from tables: applied only when its agent answered badly or
did not answer — never for a wait or a fault of the control plane's own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest

from gpufleet.scheduler.tick.dispatch_failure import (
    BACKS_OFF,
    DISPATCH_TOOK,
    DispatchFailure,
    backed_off,
    backoff_s,
    classify_agent_error,
    overdue,
)

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
DEADLINE = timedelta(seconds=30)


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (grpc.StatusCode.DEADLINE_EXCEEDED, DispatchFailure.AGENT_TIMEOUT),
        (grpc.StatusCode.UNAVAILABLE, DispatchFailure.AGENT_UNREACHABLE),
        (grpc.StatusCode.UNAUTHENTICATED, DispatchFailure.AGENT_UNREACHABLE),
        (grpc.StatusCode.CANCELLED, DispatchFailure.AGENT_UNREACHABLE),
        (grpc.StatusCode.FAILED_PRECONDITION, DispatchFailure.AGENT_REFUSED),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, DispatchFailure.AGENT_REFUSED),
        (grpc.StatusCode.INVALID_ARGUMENT, DispatchFailure.AGENT_REFUSED),
        (grpc.StatusCode.INTERNAL, DispatchFailure.AGENT_REFUSED),
        (grpc.StatusCode.PERMISSION_DENIED, DispatchFailure.AGENT_REFUSED),
        (None, DispatchFailure.AGENT_REFUSED),
    ],
)
def test_an_agent_calls_status_names_its_failure(
    code: grpc.StatusCode | None, cause: DispatchFailure
) -> None:
    assert classify_agent_error(code) is cause


@pytest.mark.parametrize(
    ("cause", "backs_off"),
    [
        (DispatchFailure.AGENT_REFUSED, True),
        (DispatchFailure.AGENT_UNREACHABLE, True),
        (DispatchFailure.AGENT_TIMEOUT, True),
        (DispatchFailure.NOT_DISPATCHED, False),
        (DispatchFailure.TOKENS_NOT_MINTED, False),
    ],
)
def test_only_the_agents_own_failures_back_its_machine_off(cause: DispatchFailure, backs_off: bool) -> None:
    assert BACKS_OFF[cause] is backs_off


def test_every_failure_has_a_back_off_rule() -> None:
    assert set(BACKS_OFF) == set(DispatchFailure)


@pytest.mark.parametrize(
    ("in_flight", "sent_s_ago", "verdict"),
    [
        # Still waiting in our own pool (never sent): not taken back, whatever the clock says.
        (True, None, None),
        # Sent recently (it waited in our pool first): the agent still has its deadline.
        (True, 5.0, None),
        (True, 30.0, None),
        # Sent longer than the deadline ago and not answered: the agent's timeout.
        (True, 30.5, DispatchFailure.AGENT_TIMEOUT),
        (True, 600.0, DispatchFailure.AGENT_TIMEOUT),
        # No process here is dispatching it (a leader change, a restart): ours, no back-off.
        (False, None, DispatchFailure.NOT_DISPATCHED),
    ],
)
def test_a_dispatch_past_its_deadline_is_taken_back_only_for_a_silent_agent_or_an_orphan(
    in_flight: bool, sent_s_ago: float | None, verdict: DispatchFailure | None
) -> None:
    sent_at = None if sent_s_ago is None else NOW - timedelta(seconds=sent_s_ago)
    assert overdue(NOW, deadline=DEADLINE, in_flight=in_flight, sent_at=sent_at) is verdict
    if verdict is not None and in_flight:
        assert BACKS_OFF[verdict], "an agent that did not answer backs off"


def test_the_back_off_doubles_per_failure_in_a_row_up_to_its_cap() -> None:
    assert [backoff_s(n, 30.0, 600.0) for n in range(1, 8)] == [30, 60, 120, 240, 480, 600, 600]


def test_each_failure_in_a_row_moves_the_machines_back_off_columns_and_a_dispatch_taken_resets_them() -> None:
    """The columns the dispatch writes (and the simulator applies): the count goes up by
    one per failure and the back-off ends ``backoff_s`` of the new count from now; a
    dispatch the agent took leaves no back-off and no count."""
    first = backed_off(0, NOW, 30.0, 600.0)
    assert (first.dispatch_failures, first.dispatch_backoff_until) == (1, NOW + timedelta(seconds=30))
    fifth = backed_off(4, NOW, 30.0, 600.0)
    assert (fifth.dispatch_failures, fifth.dispatch_backoff_until) == (5, NOW + timedelta(seconds=480))
    assert backed_off(9, NOW, 30.0, 600.0).dispatch_backoff_until == NOW + timedelta(seconds=600)
    assert DISPATCH_TOOK.values() == {"dispatch_failures": 0, "dispatch_backoff_until": None}
