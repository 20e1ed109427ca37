"""Which events a reopened watch gives again (none), and how long it keeps reopening."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.client import errors
from gpufleet.client.watch_resume import FIRST_PAUSE_S, MAX_PAUSE_S, WatchResume
from gpufleet.v1 import job_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def event(state: int, second: int, message: str = "") -> job_pb2.JobEvent:
    return job_pb2.JobEvent(state=state, event_time=Timestamp(seconds=second), message=message)  # type: ignore[arg-type]


def lost(
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE, retry_s: float | None = None
) -> errors.GpufleetApiError:
    delay = None if retry_s is None else timedelta(seconds=retry_s)
    return errors.error_class(code)(code, "gone", retry_after=delay)


QUEUED, RUNNING, DONE = job_pb2.JOB_STATE_QUEUED, job_pb2.JOB_STATE_RUNNING, job_pb2.JOB_STATE_SUCCEEDED


def test_a_replayed_history_is_given_once() -> None:
    resume = WatchResume(60)
    first = [event(QUEUED, 1, "submitted"), event(QUEUED, 2, "waiting"), event(RUNNING, 3)]
    assert [resume.heard(e) for e in first] == [True, True, True]
    # The reopened stream starts over, then goes on.
    replay = [*first, event(QUEUED, 4, "requeued"), event(RUNNING, 5), event(DONE, 6)]
    assert [resume.heard(e) for e in replay] == [False, False, False, True, True, True]
    assert resume.ended


def test_the_same_state_at_another_time_or_with_another_message_is_new() -> None:
    resume = WatchResume(60)
    assert resume.heard(event(QUEUED, 1, "submitted"))
    assert resume.heard(event(QUEUED, 1, "waiting"))
    assert resume.heard(event(QUEUED, 2, "submitted"))
    assert not resume.ended


@pytest.mark.parametrize(
    "state", [job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED, job_pb2.JOB_STATE_TIMED_OUT, DONE]
)
def test_a_final_state_ends_the_watch(state: int) -> None:
    resume = WatchResume(60)
    resume.heard(event(state, 1))
    assert resume.ended


def test_the_first_loss_after_an_answer_reopens_at_once() -> None:
    clock = Clock()
    resume = WatchResume(60, clock)
    resume.heard(event(QUEUED, 1))
    assert resume.cut(lost()) == 0.0
    assert resume.time_left() == 60
    # The stream's own deadline running out is a loss like any other.
    resume.heard(event(QUEUED, 1))
    assert resume.cut(lost(grpc.StatusCode.DEADLINE_EXCEEDED)) == 0.0


def test_losses_without_an_answer_back_off_within_the_allowance() -> None:
    clock = Clock()
    resume = WatchResume(10, clock)
    assert resume.cut(lost()) == 0.0
    pauses = []
    for _ in range(6):
        clock.now += 1
        pauses.append(resume.cut(lost()))
    # Doubling up to MAX_PAUSE_S, the last one cut to the 4 s the allowance has left.
    assert pauses == [FIRST_PAUSE_S, 0.5, 1.0, 2.0, 4.0, 4.0] and MAX_PAUSE_S > 4
    clock.now += 4
    assert resume.time_left() == 0 and resume.cut(lost()) is None


def test_the_servers_retry_delay_is_the_pause() -> None:
    clock = Clock()
    resume = WatchResume(60, clock)
    resume.cut(lost())
    assert resume.cut(lost(retry_s=3)) == 3


def test_an_answer_ends_the_outage() -> None:
    clock = Clock()
    resume = WatchResume(10, clock)
    resume.cut(lost())
    clock.now += 9
    resume.heard(event(QUEUED, 1))
    clock.now += 5
    assert resume.cut(lost()) == 0.0 and resume.time_left() == 10


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
    ],
)
def test_other_failures_end_the_watch(code: grpc.StatusCode) -> None:
    assert WatchResume(60).cut(lost(code)) is None
