"""The dead-man switch's decision, from a table, and its act on a manual clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.agent.dead_man import MARKER, Contact, DeadManSwitch, Policy, Verdict, decide
from gpufleet.common.clock import ManualClock

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
HALF_HOUR = timedelta(minutes=30)


@pytest.mark.parametrize(
    ("quiet", "busy", "action", "verdict"),
    [
        (HALF_HOUR, False, "shutdown", Verdict.STOP),
        (HALF_HOUR - timedelta(seconds=1), False, "shutdown", Verdict.HEARD_RECENTLY),
        (timedelta(hours=10), True, "shutdown", Verdict.BUSY),  # a running attempt always wins
        (timedelta(hours=10), False, "off", Verdict.OFF),
        (timedelta(hours=10), True, "session", Verdict.BUSY),
        (HALF_HOUR, False, "session", Verdict.STOP),
    ],
)
def test_decide(quiet: timedelta, busy: bool, action: str, verdict: Verdict) -> None:
    policy = Policy(after=HALF_HOUR, action=action)  # type: ignore[arg-type]
    assert decide(T0 + quiet, T0, busy, policy) is verdict


def test_the_switch_acts_once_after_the_marker_and_contact_resets_it(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    contact = Contact(clock.now())
    acted: list[str] = []
    busy = [False]
    switch = DeadManSwitch(
        clock,
        contact,
        busy=lambda: busy[0],
        policy=Policy(after=HALF_HOUR, action="shutdown"),
        marker_dir=tmp_path,
        act=lambda: acted.append("stop" if (tmp_path / MARKER).exists() else "stop without marker"),
    )
    clock.advance(timedelta(minutes=29))
    assert switch.check() is Verdict.HEARD_RECENTLY
    contact.heard(clock.now())  # the reaper's sample
    clock.advance(timedelta(minutes=29))
    assert switch.check() is Verdict.HEARD_RECENTLY
    busy[0] = True
    clock.advance(timedelta(hours=5))
    assert switch.check() is Verdict.BUSY and acted == []
    busy[0] = False
    assert switch.check() is Verdict.STOP
    assert acted == ["stop"], "the marker is written before the machine is stopped"
    assert "no control-plane call" in (tmp_path / MARKER).read_text()


def test_contact_never_moves_back() -> None:
    contact = Contact(T0)
    contact.heard(T0 - timedelta(minutes=5))  # a late call answered out of order
    assert contact.last() == T0
