"""Boot failure's decision, from a table: never reported, past its boot window from first
observation, and re-confirmed live across two ticks before acting."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from gpufleet.reaper.agent_probe import StartupProbe
from gpufleet.reaper.boot_failure import (
    BootFailurePolicy,
    CheckStartup,
    ClearStartupFailure,
    DestroyMachine,
    RecordStartupFailure,
    decide,
    due_at,
    gate,
)
from gpufleet.reaper.refusal import MachineSnapshot, RefusalReason, Refuse, first_refusal
from tests.unit.reaper.nets_fixtures import HEALTHY, NOW, ago

POLICY = BootFailurePolicy(window=timedelta(minutes=30))
# Up for 31 minutes, its agent answering, its worker never reporting.
UNREPORTED = replace(HEALTHY, state="BOOTING", first_observed_at=ago(minutes=31), worker_report_at=None)
SEEN = replace(UNREPORTED, startup_failed_at=ago(minutes=1))

FAILED = StartupProbe(startup_complete=False, startup_error="image pull: manifest unknown")
NOT_DONE = StartupProbe(startup_complete=False)
WORKER_DEAD = StartupProbe(startup_complete=True, worker_alive=False)
HEALTHY_PROBE = StartupProbe(startup_complete=True)

CASES: list[tuple[str, MachineSnapshot, StartupProbe | None, list[Any]]] = [
    (
        "inside the boot window",
        replace(UNREPORTED, first_observed_at=ago(minutes=29)),
        FAILED,
        [Refuse(RefusalReason.IN_GRACE_WINDOW)],
    ),
    (
        "never observed: the window cannot have passed",
        replace(UNREPORTED, first_observed_at=None),
        FAILED,
        [Refuse(RefusalReason.IN_GRACE_WINDOW)],
    ),
    ("first sighting of a failed start-up", UNREPORTED, FAILED, [RecordStartupFailure]),
    ("first sighting: start-up not complete", UNREPORTED, NOT_DONE, [RecordStartupFailure]),
    ("first sighting: agent unreachable", UNREPORTED, None, [RecordStartupFailure]),
    ("first sighting: worker not alive", UNREPORTED, WORKER_DEAD, [RecordStartupFailure]),
    ("re-confirmed on a later tick", SEEN, FAILED, [DestroyMachine]),
    ("re-confirmed: still unreachable", SEEN, None, [DestroyMachine]),
    (
        "a sighting from before the latest start is no sighting",
        replace(SEEN, startup_failed_at=ago(minutes=40)),
        FAILED,
        [RecordStartupFailure],
    ),
    (
        "a sighting stamped this very tick is not a second tick",
        replace(SEEN, startup_failed_at=NOW),
        FAILED,
        [RecordStartupFailure],
    ),
    ("passes: not destroyed", UNREPORTED, HEALTHY_PROBE, [Refuse(RefusalReason.STARTUP_HEALTHY)]),
    (
        "fails once then passes: sighting cleared, not destroyed",
        SEEN,
        HEALTHY_PROBE,
        [ClearStartupFailure(), Refuse(RefusalReason.STARTUP_HEALTHY)],
    ),
    (
        "reported in this life: went silent's",
        replace(UNREPORTED, worker_report_at=ago(minutes=20)),
        FAILED,
        [],
    ),
    (
        "reported only before the latest start: still this net's",
        replace(UNREPORTED, worker_report_at=ago(hours=2)),
        FAILED,
        [RecordStartupFailure],
    ),
    (
        "ready but never reported (a drifted row) counts",
        replace(UNREPORTED, state="READY"),
        FAILED,
        [RecordStartupFailure],
    ),
    ("stopped: not this net's", replace(UNREPORTED, state="STOPPED"), FAILED, []),
    (
        "exempt class, by class",
        replace(UNREPORTED, workload_class="SILENT"),
        FAILED,
        [Refuse(RefusalReason.EXEMPT_CLASS)],
    ),
    ("pinned", replace(UNREPORTED, live_attempts=1), FAILED, [Refuse(RefusalReason.WORK_PINNED)]),
    ("registered box", replace(UNREPORTED, origin="REGISTERED"), FAILED, [Refuse(RefusalReason.NOT_OURS)]),
]


@pytest.mark.parametrize(("machine", "probe", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(machine: MachineSnapshot, probe: StartupProbe | None, expected: list[object]) -> None:
    actions = decide(NOW, machine, probe, POLICY)
    if expected and isinstance(expected[0], type):
        assert [type(a) for a in actions] == expected
    else:
        assert actions == expected


def test_the_destroy_names_both_sightings_and_the_error() -> None:
    [action] = decide(NOW, SEEN, FAILED, POLICY)
    assert isinstance(action, DestroyMachine)
    assert "image pull: manifest unknown" in action.details
    assert SEEN.startup_failed_at is not None and SEEN.startup_failed_at.isoformat() in action.details


def test_a_healthy_agent_whose_worker_never_reports_is_not_refused_forever() -> None:
    long_silent = replace(UNREPORTED, first_observed_at=ago(minutes=61))
    assert [type(a) for a in decide(NOW, long_silent, HEALTHY_PROBE, POLICY)] == [RecordStartupFailure]
    confirmed = replace(long_silent, startup_failed_at=ago(minutes=1))
    [action] = decide(NOW, confirmed, HEALTHY_PROBE, POLICY)
    assert isinstance(action, DestroyMachine)
    assert "has not reported in twice the boot window" in action.details
    # Until then a healthy probe still wins: a slow start that finishes is never destroyed.
    assert decide(NOW, replace(long_silent, first_observed_at=ago(minutes=59)), HEALTHY_PROBE, POLICY) == [
        Refuse(RefusalReason.STARTUP_HEALTHY)
    ]


@pytest.mark.parametrize("machine", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_the_boot_window_ends_exactly_at_due_at(machine: MachineSnapshot) -> None:
    """``due_at`` is the net's requeue-after: a machine it names is refused in its boot
    window a microsecond before and looked at from then (other gates aside: a pinned or
    exempt machine is refused for that instead); one it says is never due is never looked
    at by time alone."""
    at = due_at(machine, POLICY)
    if at is None:
        for later in (NOW, NOW + timedelta(days=30)):
            assert not isinstance(gate(later, machine, POLICY), CheckStartup)
        return
    assert not isinstance(gate(at - timedelta(microseconds=1), machine, POLICY), CheckStartup)
    assert gate(at, machine, POLICY) != Refuse(RefusalReason.IN_GRACE_WINDOW)
    if first_refusal(at, machine, POLICY.gates) is None:
        assert gate(at - timedelta(microseconds=1), machine, POLICY) == Refuse(RefusalReason.IN_GRACE_WINDOW)
        assert gate(at, machine, POLICY) == CheckStartup(machine.machine_id)
