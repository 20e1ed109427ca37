"""Where a reopened watch resumes (after the last sequence it gave), which events it gives
again (none), and how long it keeps reopening."""

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


def event(state: int, sequence: int, message: str = "") -> job_pb2.JobEvent:
    return job_pb2.JobEvent(
        state=state,  # type: ignore[arg-type]
        event_time=Timestamp(seconds=1_700_000_000),
        message=message,
        sequence=sequence,
    )


def lost(
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE, retry_s: float | None = None
) -> errors.GpufleetApiError:
    delay = None if retry_s is None else timedelta(seconds=retry_s)
    return errors.error_class(code)(code, "gone", retry_after=delay)


QUEUED, RUNNING, DONE = job_pb2.JOB_STATE_QUEUED, job_pb2.JOB_STATE_RUNNING, job_pb2.JOB_STATE_SUCCEEDED


def test_the_next_stream_resumes_after_the_last_event_given() -> None:
    resume = WatchResume(60)
    assert resume.after_sequence == 0
    first = [event(QUEUED, 3, "submitted"), event(QUEUED, 8, "waiting"), event(RUNNING, 20)]
    assert [resume.heard(e) for e in first] == [True, True, True]
    assert resume.after_sequence == 20
    assert resume.heard(event(DONE, 21)) and resume.ended


def test_events_not_past_the_resume_point_are_not_given_again() -> None:
    # What a server that ignored after_sequence would send: the history again, then more.
    resume = WatchResume(60)
    first = [event(QUEUED, 1, "submitted"), event(RUNNING, 5)]
    assert [resume.heard(e) for e in first] == [True, True]
    replay = [*first, event(QUEUED, 9, "requeued"), event(RUNNING, 12), event(DONE, 13)]
    assert [resume.heard(e) for e in replay] == [False, False, True, True, True]
    assert resume.after_sequence == 13 and resume.ended


def test_identical_looking_events_with_new_sequences_are_all_given() -> None:
    # Same state, time and message: told apart by sequence alone.
    resume = WatchResume(60)
    assert [resume.heard(event(QUEUED, n, "waiting: capacity")) for n in (4, 6, 7)] == [True, True, True]
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
