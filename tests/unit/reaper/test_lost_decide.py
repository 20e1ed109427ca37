"""The lost detector's decision, from a table: all three channels together; it only marks."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from gpufleet.reaper.lost_detector import LostPolicy, MarkLost, UnmarkLost, decide, due_at
from gpufleet.reaper.refusal import MachineSnapshot, RefusalReason, Refuse
from tests.unit.reaper.nets_fixtures import HEALTHY, NOW, ago

POLICY = LostPolicy(lost_after=timedelta(minutes=3), still_there_within=timedelta(minutes=5))
# Reached an hour ago, probe failing for 3 minutes, still listed by the provider.
UNREACHABLE = replace(
    HEALTHY, probe_ok_at=ago(minutes=4), probe_failed_since=ago(minutes=3), provider_seen_at=ago(seconds=30)
)

MARK = "mark"
CASES: list[tuple[str, MachineSnapshot, object]] = [
    ("probe failing 3 min, provider lists it", UNREACHABLE, MARK),
    ("probe failing 2:59", replace(UNREACHABLE, probe_failed_since=ago(minutes=2, seconds=59)), None),
    (
        "provider stale but the worker still reports",
        replace(UNREACHABLE, provider_seen_at=ago(hours=1)),
        MARK,
    ),
    (
        "no channel says it is there",
        replace(UNREACHABLE, provider_seen_at=ago(hours=1), worker_report_at=ago(hours=1)),
        Refuse(RefusalReason.NO_SIGN_OF_LIFE),
    ),
    ("never reached at all: not lost", replace(UNREACHABLE, probe_ok_at=None), None),
    ("booting machines can be lost", replace(UNREACHABLE, state="BOOTING"), MARK),
    ("stopped machines are not probed", replace(UNREACHABLE, state="STOPPED"), None),
    ("already lost, still failing", replace(UNREACHABLE, lost=True), None),
    ("lost and reachable again", replace(HEALTHY, lost=True), UnmarkLost("m")),
    ("lost, stopped, reachable again", replace(HEALTHY, lost=True, state="STOPPED"), UnmarkLost("m")),
    ("reachable and not lost", HEALTHY, None),
    ("not managed: not ours to mark", replace(UNREACHABLE, managed=False), None),
    # Marking is routing, not destroying: a pinned or exempt machine is marked all the same.
    ("pinned machines are marked too", replace(UNREACHABLE, live_attempts=2), MARK),
    (
        "exempt class is marked too",
        replace(UNREACHABLE, workload_class="SILENT", worker_report_at=None),
        MARK,
    ),
]


@pytest.mark.parametrize(("machine", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(machine: MachineSnapshot, expected: object) -> None:
    decision = decide(NOW, machine, POLICY)
    if expected == MARK:
        assert isinstance(decision, MarkLost)
    else:
        assert decision == expected


def test_the_lost_detector_is_given_no_way_to_stop_or_destroy() -> None:
    import inspect

    from gpufleet.reaper.lost_detector import LostDetector

    params = set(inspect.signature(LostDetector.__init__).parameters)
    # Its instruments only record what it did (gpufleet.reaper.detection_latency).
    assert params == {"self", "sessions", "lease", "clock", "policy", "instruments"}


@pytest.mark.parametrize("machine", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_the_mark_falls_due_exactly_at_due_at(machine: MachineSnapshot) -> None:
    """``due_at`` is the detector's requeue-after: nothing changing, the decision first marks
    (or refuses for want of a sign of life) at it and not a microsecond before; a machine it
    says is never due is never marked by time alone. Over every machine of the table, and
    the same machines an hour back in time."""
    for shift in (timedelta(0), timedelta(hours=1)):
        m = _shifted(machine, shift)
        at = due_at(m, POLICY)
        if at is None:
            for later in (NOW, NOW + timedelta(days=30)):
                assert not isinstance(decide(later, m, POLICY), MarkLost | Refuse)
            continue
        assert decide(at - timedelta(microseconds=1), m, POLICY) is None
        assert isinstance(decide(at, m, POLICY), MarkLost | Refuse)


def _shifted(m: MachineSnapshot, by: timedelta) -> MachineSnapshot:
    """The machine with every clock ``by`` earlier."""

    def back(at: datetime | None) -> datetime | None:
        return at - by if at is not None else None

    return replace(
        m,
        probe_ok_at=back(m.probe_ok_at),
        probe_failed_since=back(m.probe_failed_since),
        provider_seen_at=back(m.provider_seen_at),
        worker_report_at=back(m.worker_report_at),
        first_observed_at=back(m.first_observed_at),
    )
