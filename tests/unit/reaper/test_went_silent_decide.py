"""Went silent's decision, from a table: the worker's own clock and nothing else."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

import pytest

from gpufleet.reaper.refusal import MachineSnapshot, RefusalReason, Refuse
from gpufleet.reaper.went_silent import FLOOR, DestroyMachine, WentSilentPolicy, decide
from tests.unit.reaper.nets_fixtures import HEALTHY, NOW, ago

POLICY = WentSilentPolicy(silent_after=timedelta(minutes=15), grace=timedelta(minutes=10))
SILENT = replace(HEALTHY, worker_report_at=ago(minutes=15))

DESTROY = "destroy"
CASES: list[tuple[str, MachineSnapshot, object]] = [
    ("silent for the threshold", SILENT, DESTROY),
    ("a second short of it", replace(SILENT, worker_report_at=ago(minutes=14, seconds=59)), None),
    ("reporting", HEALTHY, None),
    # The argument against a merged check: the other two channels stay warm.
    (
        "provider and probe warm, worker silent",
        replace(SILENT, provider_seen_at=NOW, probe_ok_at=NOW, probe_failed_since=None),
        DESTROY,
    ),
    (
        "provider and probe cold, worker reporting",
        replace(HEALTHY, provider_seen_at=ago(hours=1), probe_ok_at=None, probe_failed_since=ago(hours=1)),
        None,
    ),
    ("marked lost does not protect a silent worker", replace(SILENT, lost=True), DESTROY),
    ("never reported: boot failure's", replace(SILENT, worker_report_at=None), None),
    (
        "reported only before its latest start: boot failure's",
        replace(SILENT, first_observed_at=ago(minutes=2), worker_report_at=ago(hours=3)),
        None,
    ),
    ("booting machines count too", replace(SILENT, state="BOOTING"), DESTROY),
    ("draining machines count too", replace(SILENT, state="DRAINING"), DESTROY),
    ("stopped: not running, not this net's", replace(SILENT, state="STOPPED"), None),
    ("transitional: stuck transition's", replace(SILENT, state="STOPPING"), None),
    ("exempt class, by class", replace(SILENT, workload_class="SILENT"), Refuse(RefusalReason.EXEMPT_CLASS)),
    ("pinned", replace(SILENT, live_attempts=1), Refuse(RefusalReason.WORK_PINNED)),
    ("registered box", replace(SILENT, origin="REGISTERED"), Refuse(RefusalReason.NOT_OURS)),
    ("not managed", replace(SILENT, managed=False), Refuse(RefusalReason.NOT_OURS)),
    (
        "reported but never observed: the grace window cannot be shown to have passed",
        replace(SILENT, first_observed_at=None),
        Refuse(RefusalReason.IN_GRACE_WINDOW),
    ),
]


@pytest.mark.parametrize(("machine", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(machine: MachineSnapshot, expected: object) -> None:
    decision = decide(NOW, machine, POLICY)
    if expected == DESTROY:
        assert isinstance(decision, DestroyMachine) and decision.machine_id == machine.machine_id
    else:
        assert decision == expected


def test_a_threshold_under_the_floor_is_raised_to_it_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpufleet.reaper.went_silent"):
        policy = WentSilentPolicy(silent_after=timedelta(minutes=1))
    assert policy.silent_after == FLOOR == timedelta(minutes=5)
    assert any("floor" in r.getMessage() for r in caplog.records)
    assert decide(NOW, replace(HEALTHY, worker_report_at=ago(minutes=2)), policy) is None
    assert decide(NOW, replace(HEALTHY, worker_report_at=ago(minutes=4, seconds=59)), policy) is None
    assert isinstance(decide(NOW, replace(HEALTHY, worker_report_at=ago(minutes=5)), policy), DestroyMachine)


def test_a_threshold_over_the_floor_is_kept_silently(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpufleet.reaper.went_silent"):
        assert WentSilentPolicy(silent_after=timedelta(minutes=6)).silent_after == timedelta(minutes=6)
    assert caplog.records == []


def test_the_gate_reads_no_other_channel() -> None:
    import inspect

    import gpufleet.reaper.went_silent as module

    source = inspect.getsource(module).split('"""', 2)[2]  # the code, not the docstring
    assert "provider_seen_at" not in source and "probe_ok_at" not in source
    assert "probe_failed_since" not in source
