"""The agent's pause watch and the rule that refuses a start its caller may have given up
on: a call read right after this process was paused, with less of its deadline left than
the time since the pause began. Pure: a fake monotonic clock, no threads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from gpufleet.agent.pauses import FLOOR_S, READ_SLACK_S, Pause, PauseWatch, may_have_outlived
from gpufleet.common.errors import DeadlineExceeded
from tests.unit.agent.factories import start_request, state_dir
from tests.unit.agent.test_servicer import servicer


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeContext:
    """A server context as gRPC hands one to a handler: active until the caller cancels,
    with what is left of the deadline the server started when it read the call."""

    remaining_s: float | None = 30.0
    active: bool = True
    reads: list[str] = field(default_factory=list)

    def is_active(self) -> bool:
        return self.active

    def time_remaining(self) -> float | None:
        return self.remaining_s


def test_the_watch_sees_a_gap_as_a_pause_and_ticks_as_none() -> None:
    clock = FakeMonotonic()
    watch = PauseWatch(every_s=0.05, monotonic=clock)
    for _ in range(10):
        clock.now += 0.05
        watch.tick()
    assert watch.last(clock.now) is None
    clock.now += 0.05 + FLOOR_S - 0.01  # a late tick, under the floor: noise
    watch.tick()
    assert watch.last(clock.now) is None
    began = clock.now
    clock.now += 2.0
    watch.tick()
    assert watch.last(clock.now) == Pause(began, began + 2.0)


def test_a_pause_the_thread_has_not_seen_end_is_seen_by_the_handler() -> None:
    """Thawed, the handler may run before the watch's own thread: the gap since its last
    tick is the pause."""
    clock = FakeMonotonic()
    watch = PauseWatch(every_s=0.05, monotonic=clock)
    watch.tick()
    began = clock.now
    clock.now += 1.5
    assert watch.last(clock.now) == Pause(began, began + 1.5)


@pytest.mark.parametrize(
    ("pause", "handled_after_pause_s", "remaining_s", "refused"),
    [
        # No pause: a call is never in doubt, however little of its deadline is left.
        (None, 0.0, 0.01, False),
        # Frozen through the caller's whole one-second deadline, read at the thaw.
        (1.2, 0.0, 1.0, True),
        # The same freeze, but the caller allowed 30 s: it is still waiting.
        (1.2, 0.0, 30.0, False),
        # Paused as long as the deadline, but the call was read well after the pause ended:
        # it arrived after the pause (a running process reads at once).
        (40.0, READ_SLACK_S + 0.1, 30.0, False),
        # Read within the slack of a pause as long as what is left: in doubt.
        (29.8, READ_SLACK_S - 0.1, 29.9, True),
    ],
)
def test_a_call_is_in_doubt_only_after_a_pause_as_long_as_its_deadline(
    pause: float | None, handled_after_pause_s: float, remaining_s: float, refused: bool
) -> None:
    ended = 500.0
    paused = None if pause is None else Pause(ended - pause, ended)
    handled_at = ended + handled_after_pause_s
    assert (
        may_have_outlived(paused, handled_at=handled_at, now=handled_at + 0.01, remaining_s=remaining_s)
        is refused
    )


def test_a_start_read_after_a_pause_longer_than_its_deadline_is_refused_and_not_delivered(
    tmp_path: Path,
) -> None:
    clock = FakeMonotonic()
    state = state_dir(tmp_path)
    agent = servicer(state, pauses=PauseWatch(monotonic=clock))
    clock.now += 1.5  # SIGSTOP for 1.5 s; the call arrived meanwhile, with a 1 s deadline
    with pytest.raises(DeadlineExceeded) as refused:
        agent.StartJob(start_request("a-1"), FakeContext(remaining_s=1.0))
    assert refused.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "paused for 1.5 s" in str(refused.value)
    assert state.pending_ids() == []
    # The scheduler's next dispatch, once the agent runs again, is delivered.
    for _ in range(20):  # a second of the agent running again
        agent.pauses.tick()  # type: ignore[union-attr]
        clock.now += 0.05
    assert not agent.StartJob(start_request("a-1"), FakeContext(remaining_s=1.0)).already_running
    assert state.pending_ids() == ["a-1"]


def test_a_start_whose_caller_cancelled_is_not_delivered(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    agent = servicer(state, pauses=PauseWatch(monotonic=FakeMonotonic()))
    with pytest.raises(DeadlineExceeded):
        agent.StartJob(start_request("a-1"), FakeContext(active=False))
    assert state.pending_ids() == []
    assert not agent.StartJob(start_request("a-1"), FakeContext()).already_running
