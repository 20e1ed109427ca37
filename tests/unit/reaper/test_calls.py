"""The reaper's provider-call pool: keyed, bounded, drained on a graceful stop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from gpufleet.common.errors import Fenced
from gpufleet.common.loops import TickReport
from gpufleet.reaper.calls import Answers, ProviderCalls


def held() -> tuple[Callable[[], None], threading.Event, threading.Event]:
    """A call that waits for ``release``; ``started`` is set once it runs."""
    started, release = threading.Event(), threading.Event()

    def call() -> None:
        started.set()
        assert release.wait(10)

    return call, started, release


def test_a_key_in_flight_is_not_submitted_twice() -> None:
    calls = ProviderCalls(workers=2)
    call, started, release = held()
    assert calls.submit("m1", "stop:m1:t0", call)
    assert started.wait(5)
    ran: list[str] = []
    assert not calls.submit("m1", "stop:m1:t0", lambda: ran.append("again"))
    assert calls.busy("m1") and not calls.busy("m2")
    release.set()
    assert calls.settle(5)
    assert ran == [] and not calls.busy("m1") and calls.pending() == 0
    assert calls.submit("m1", "stop:m1:t0", lambda: ran.append("later"))  # answered: may go again
    assert calls.settle(5) and ran == ["later"]
    calls.close()


def test_a_call_waiting_for_a_worker_counts_as_in_flight() -> None:
    calls = ProviderCalls(workers=1)
    call, started, release = held()
    calls.submit("m1", "stop:m1:t0", call)
    assert started.wait(5)
    second = threading.Event()
    calls.submit("m2", "destroy:m2:t0", second.set)
    assert calls.busy("m2") and not second.is_set()
    assert not calls.settle(0.05)
    release.set()
    assert calls.settle(5) and second.is_set()
    calls.close()


def test_a_call_that_raises_frees_its_key(caplog: pytest.LogCaptureFixture) -> None:
    calls = ProviderCalls(workers=1)

    def fenced() -> None:
        raise Fenced("epoch 3 of reaper is no longer current; write refused")

    def broken() -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.WARNING, logger="gpufleet.reaper.calls"):
        calls.submit("m1", "stop:m1:t0", fenced)
        calls.submit("m2", "stop:m2:t0", broken)
        assert calls.settle(5)
    assert not calls.busy("m1") and not calls.busy("m2")
    # Lost leadership is a known case (a warning); anything else is logged with its trace.
    [(fenced_level, fenced_trace), (broken_level, broken_trace)] = sorted(
        (r.levelno, r.exc_info is not None) for r in caplog.records
    )
    assert (fenced_level, fenced_trace) == (logging.WARNING, False)
    assert (broken_level, broken_trace) == (logging.ERROR, True)
    calls.close()


def test_drain_takes_no_new_claims_and_waits_for_the_calls_out() -> None:
    calls = ProviderCalls(workers=1)
    call, started, release = held()
    calls.submit("m1", "stop:m1:t0", call)
    assert started.wait(5)
    assert calls.accepting
    assert not calls.drain(0.05)  # still out
    assert not calls.accepting
    threading.Timer(0.1, release.set).start()
    assert calls.drain(5)
    calls.close()


def test_close_forgets_the_calls_never_sent() -> None:
    calls = ProviderCalls(workers=1)
    call, started, release = held()
    calls.submit("m1", "stop:m1:t0", call)
    assert started.wait(5)
    never: list[str] = []
    calls.submit("m2", "stop:m2:t0", lambda: never.append("sent"))
    calls.close()
    assert not calls.busy("m2") and calls.busy("m1")  # the running one is left to finish
    assert not calls.submit("m3", "stop:m3:t0", lambda: never.append("sent"))
    release.set()
    assert calls.settle(5) and never == []


def test_answers_are_taken_once() -> None:
    answers = Answers()
    report = TickReport()
    report.actions["stop"] += 1
    answers.add(report)
    answers.add(report)
    assert dict(answers.take().actions) == {"stop": 2}
    assert dict(answers.take().actions) == {}
