"""The call pool a pass hands its provider and agent calls to: keyed, bounded, grouped by
machine, drained on a graceful stop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from gpufleet.common.calls import CallPool, Outcomes
from gpufleet.common.errors import Fenced
from gpufleet.common.loops import TickReport


def held() -> tuple[Callable[[], None], threading.Event, threading.Event]:
    """A call that waits for ``release``; ``started`` is set once it runs."""
    started, release = threading.Event(), threading.Event()

    def call() -> None:
        started.set()
        assert release.wait(10)

    return call, started, release


def test_a_key_in_flight_is_not_submitted_twice() -> None:
    calls = CallPool(2, "provider-calls")
    call, started, release = held()
    assert calls.submit("stop:m1:t0", group="m1", call=call)
    assert started.wait(5)
    ran: list[str] = []
    assert not calls.submit("stop:m1:t0", group="m1", call=lambda: ran.append("again"))
    assert calls.busy("m1") and not calls.busy("m2")
    release.set()
    assert calls.wait_idle(5)
    assert ran == [] and not calls.busy("m1") and calls.pending() == 0
    assert calls.submit("stop:m1:t0", group="m1", call=lambda: ran.append("later"))  # answered: may go again
    assert calls.wait_idle(5) and ran == ["later"]
    calls.close()


def test_a_call_waiting_for_a_worker_counts_as_in_flight() -> None:
    calls = CallPool(1, "provider-calls")
    call, started, release = held()
    calls.submit("stop:m1:t0", group="m1", call=call)
    assert started.wait(5)
    second = threading.Event()
    calls.submit("destroy:m2:t0", group="m2", call=second.set)
    assert calls.busy("m2") and not second.is_set()
    assert not calls.wait_idle(0.05)
    release.set()
    assert calls.wait_idle(5) and second.is_set()
    calls.close()


def test_a_call_that_raises_frees_its_key(caplog: pytest.LogCaptureFixture) -> None:
    calls = CallPool(1, "provider-calls")

    def fenced() -> None:
        raise Fenced("epoch 3 of reaper is no longer current; write refused")

    def broken() -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.WARNING, logger="gpufleet.common.calls"):
        calls.submit("stop:m1:t0", group="m1", call=fenced)
        calls.submit("stop:m2:t0", group="m2", call=broken)
        assert calls.wait_idle(5)
    assert not calls.busy("m1") and not calls.busy("m2")
    # Lost leadership is a known case (a warning); anything else is logged with its trace.
    [(fenced_level, fenced_trace), (broken_level, broken_trace)] = sorted(
        (r.levelno, r.exc_info is not None) for r in caplog.records
    )
    assert (fenced_level, fenced_trace) == (logging.WARNING, False)
    assert (broken_level, broken_trace) == (logging.ERROR, True)
    calls.close()


def test_drain_takes_no_new_claims_and_waits_for_the_calls_out() -> None:
    calls = CallPool(1, "provider-calls")
    call, started, release = held()
    calls.submit("stop:m1:t0", group="m1", call=call)
    assert started.wait(5)
    assert calls.accepting
    assert not calls.drain(0.05)  # still out
    assert not calls.accepting
    threading.Timer(0.1, release.set).start()
    assert calls.drain(5)
    calls.close()


def test_close_forgets_the_calls_never_sent() -> None:
    calls = CallPool(1, "provider-calls")
    call, started, release = held()
    calls.submit("stop:m1:t0", group="m1", call=call)
    assert started.wait(5)
    never: list[str] = []
    calls.submit("stop:m2:t0", group="m2", call=lambda: never.append("sent"))
    calls.close()
    assert not calls.busy("m2") and calls.busy("m1")  # the running one is left to finish
    assert not calls.submit("stop:m3:t0", group="m3", call=lambda: never.append("sent"))
    release.set()
    assert calls.wait_idle(5) and never == []


def test_outcomes_are_taken_once() -> None:
    answers = Outcomes()
    report = TickReport()
    report.actions["stop"] += 1
    answers.add_report(report)
    answers.add("stop")
    assert dict(answers.take().actions) == {"stop": 2}
    assert dict(answers.take().actions) == {}
