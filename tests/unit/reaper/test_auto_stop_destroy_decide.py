"""Auto-stop and auto-destroy decisions, from tables: due timers, the ladder, the net's own condition."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.reaper import auto_destroy, auto_stop
from gpufleet.reaper.auto_destroy import AutoDestroyPolicy, DestroyMachine
from gpufleet.reaper.auto_stop import AutoStopPolicy, StopMachine
from gpufleet.reaper.refusal import MachineSnapshot, RefusalReason, Refuse

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PAST = NOW - timedelta(seconds=1)
M = MachineSnapshot(
    machine_id="m",
    origin="PROVISIONED",
    managed=True,
    state="READY",
    intent="RUNNING",
    workload_class="REPORTING",
    live_attempts=0,
    first_observed_at=NOW - timedelta(hours=3),
)

STOP_CASES = [
    ("due: stop", replace(M, stop_due_at=PAST), StopMachine("m")),
    ("due exactly now: stop", replace(M, stop_due_at=NOW), StopMachine("m")),
    ("draining and due: stop", replace(M, state="DRAINING", stop_due_at=PAST), StopMachine("m")),
    ("not armed: nothing", M, None),
    ("not due: nothing", replace(M, stop_due_at=NOW + timedelta(seconds=1)), None),
    ("registered", replace(M, origin="REGISTERED", stop_due_at=PAST), Refuse(RefusalReason.NOT_OURS)),
    ("destroyed", replace(M, state="DESTROYED", stop_due_at=PAST), Refuse(RefusalReason.ALREADY_DESTROYED)),
    ("pinned", replace(M, live_attempts=1, stop_due_at=PAST), Refuse(RefusalReason.WORK_PINNED)),
    (
        "silent class is not exempt here",
        replace(M, workload_class="SILENT", stop_due_at=PAST),
        StopMachine("m"),
    ),
    (
        "in grace",
        replace(M, first_observed_at=NOW - timedelta(minutes=1), stop_due_at=PAST),
        Refuse(RefusalReason.IN_GRACE_WINDOW),
    ),
    ("already stopped", replace(M, state="STOPPED", stop_due_at=PAST), Refuse(RefusalReason.NOT_RUNNING)),
    ("stopping", replace(M, state="STOPPING", stop_due_at=PAST), Refuse(RefusalReason.NOT_RUNNING)),
    ("unknown state", replace(M, state="WEIRD", stop_due_at=PAST), Refuse(RefusalReason.NOT_RUNNING)),
    # One of its pool's warm machines: kept running while quiet, until the pool releases it.
    ("warm", replace(M, warm_held=True, stop_due_at=PAST), Refuse(RefusalReason.WARM_CAPACITY)),
    (
        "warm but registered",
        replace(M, warm_held=True, origin="REGISTERED", stop_due_at=PAST),
        Refuse(RefusalReason.NOT_OURS),
    ),
]


@pytest.mark.parametrize(("machine", "expected"), [c[1:] for c in STOP_CASES], ids=[c[0] for c in STOP_CASES])
def test_auto_stop_decide(machine: MachineSnapshot, expected: object) -> None:
    assert auto_stop.decide(NOW, machine, AutoStopPolicy(grace=timedelta(minutes=10))) == expected


DESTROY_CASES = [
    ("stopped and due: destroy", replace(M, state="STOPPED", destroy_due_at=PAST), DestroyMachine("m")),
    ("running, stop done/cleared, due: destroy", replace(M, destroy_due_at=PAST), DestroyMachine("m")),
    (
        "running with stop pending: stop first",
        replace(M, stop_due_at=PAST, destroy_due_at=PAST),
        Refuse(RefusalReason.STOP_PENDING),
    ),
    ("not armed: nothing", replace(M, state="STOPPED"), None),
    ("not due: nothing", replace(M, state="STOPPED", destroy_due_at=NOW + timedelta(seconds=1)), None),
    (
        "registered",
        replace(M, origin="REGISTERED", state="STOPPED", destroy_due_at=PAST),
        Refuse(RefusalReason.NOT_OURS),
    ),
    (
        "unmanaged",
        replace(M, managed=False, state="STOPPED", destroy_due_at=PAST),
        Refuse(RefusalReason.NOT_OURS),
    ),
    (
        "destroyed",
        replace(M, state="DESTROYED", destroy_due_at=PAST),
        Refuse(RefusalReason.ALREADY_DESTROYED),
    ),
    (
        "pinned",
        replace(M, state="STOPPED", live_attempts=1, destroy_due_at=PAST),
        Refuse(RefusalReason.WORK_PINNED),
    ),
    (
        "in grace",
        replace(M, state="STOPPED", first_observed_at=NOW, destroy_due_at=PAST),
        Refuse(RefusalReason.IN_GRACE_WINDOW),
    ),
    (
        "destroying (failed call) is not retried",
        replace(M, state="DESTROYING", destroy_due_at=PAST),
        Refuse(RefusalReason.NOT_STOPPED_OR_IDLE),
    ),
    (
        "stopping",
        replace(M, state="STOPPING", destroy_due_at=PAST),
        Refuse(RefusalReason.NOT_STOPPED_OR_IDLE),
    ),
    (
        "unknown state",
        replace(M, state="WEIRD", destroy_due_at=PAST),
        Refuse(RefusalReason.NOT_STOPPED_OR_IDLE),
    ),
    (
        "running and warm",
        replace(M, warm_held=True, destroy_due_at=PAST),
        Refuse(RefusalReason.WARM_CAPACITY),
    ),
    # A pin on a stopped machine holds nothing running: its timer still applies.
    (
        "stopped, pin left over",
        replace(M, state="STOPPED", warm_held=True, destroy_due_at=PAST),
        DestroyMachine("m"),
    ),
]


@pytest.mark.parametrize(
    ("machine", "expected"), [c[1:] for c in DESTROY_CASES], ids=[c[0] for c in DESTROY_CASES]
)
def test_auto_destroy_decide(machine: MachineSnapshot, expected: object) -> None:
    assert auto_destroy.decide(NOW, machine, AutoDestroyPolicy(grace=timedelta(minutes=10))) == expected
