"""The bounded wait on a zone operation, with a scripted poll and injected time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from google.cloud import compute_v1

from gpufleet.common.clock import ManualClock
from gpufleet.common.provider_errors import NotYetDone
from gpufleet.provisioner.drivers.gcp_operations import OperationWaiter, is_done

RUNNING = compute_v1.Operation.Status.RUNNING
DONE = compute_v1.Operation.Status.DONE


def op(status: Any) -> compute_v1.Operation:
    return compute_v1.Operation(name="operation-1", status=status)


class RealTimeIsClockTime(ManualClock):
    """A manual clock whose seconds take as long in real time (ManualClock says 0.05 s)."""

    def real_seconds(self, seconds: float) -> float:
        return seconds


@dataclass
class ScriptedPoll:
    """Answers from a list; each poll moves the clock and the monotonic source as told."""

    answers: list[Any]
    clock: ManualClock
    clock_per_poll: float = 0.0
    real_per_poll: float = 0.0
    real: float = 100.0
    holds: list[float] = field(default_factory=list)

    def __call__(self, zone: str, operation: str, hold_s: float) -> Any:
        self.holds.append(hold_s)
        self.clock.advance(self.clock_per_poll)
        self.real += self.real_per_poll
        return self.answers.pop(0) if self.answers else op(RUNNING)

    def monotonic(self) -> float:
        return self.real


def waiter(poll: ScriptedPoll, wait_s: float = 60, poll_s: float = 20) -> OperationWaiter:
    return OperationWaiter(poll, poll.clock, wait_s=wait_s, poll_s=poll_s, monotonic=poll.monotonic)


def test_an_operation_done_at_once_needs_no_poll() -> None:
    poll = ScriptedPoll([], RealTimeIsClockTime())
    assert is_done(waiter(poll).wait(op(DONE), "z", "create")) is True
    assert poll.holds == []


def test_it_polls_until_done_and_a_poll_without_answer_keeps_waiting() -> None:
    poll = ScriptedPoll(
        [None, op(RUNNING), None, op(DONE)], RealTimeIsClockTime(), clock_per_poll=1, real_per_poll=1
    )
    assert is_done(waiter(poll).wait(op(RUNNING), "z", "create"))
    assert len(poll.holds) == 4


def test_the_bound_is_measured_on_the_injected_clock() -> None:
    poll = ScriptedPoll([], RealTimeIsClockTime(), clock_per_poll=10, real_per_poll=0.001)
    with pytest.raises(NotYetDone, match="after 60s"):
        waiter(poll, wait_s=60).wait(op(RUNNING), "z", "stop gf-1")
    assert len(poll.holds) == 6


def test_real_time_also_bounds_it_when_the_clock_stands_still() -> None:
    poll = ScriptedPoll([], RealTimeIsClockTime(), clock_per_poll=0, real_per_poll=5)
    with pytest.raises(NotYetDone):
        waiter(poll, wait_s=12, poll_s=20).wait(op(RUNNING), "z", "delete gf-1")
    # Each poll may hold only what is left of the real budget, never more than poll_s.
    assert poll.holds == [12, 7, 2]


def test_a_manual_clock_allows_only_its_short_real_budget() -> None:
    poll = ScriptedPoll([], ManualClock(), real_per_poll=0.03)
    with pytest.raises(NotYetDone):
        waiter(poll, wait_s=3600).wait(op(RUNNING), "z", "create")
    assert len(poll.holds) == 2
    assert max(poll.holds) <= 0.05
