"""Auto-stop and auto-destroy decisions, from tables: due timers, the ladder, the net's own condition."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.reaper import auto_destroy, auto_stop
from gpufleet.reaper.auto_destroy import AutoDestroyPolicy, DestroyMachine
from gpufleet.reaper.auto_stop import AutoStopPolicy, StopMachine
from gpufleet.reaper.refusal import MachineSnapshot, RefusalReason, Refuse
from gpufleet.reaper.settings import Settings

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PAST = NOW - timedelta(seconds=1)
# The chain's gap between a stop and its destroy: a STOPPED machine with no timer is due then.
GAP = AutoDestroyPolicy().stopped_for
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
    # Stopped by its provider or outside the platform, no timer: the chain's gap from its stop.
    (
        "stopped, no timer, inside the chain's gap: nothing",
        replace(M, state="STOPPED", state_changed_at=NOW - GAP + timedelta(microseconds=1)),
        None,
    ),
    (
        "stopped, no timer, the chain's gap passed",
        replace(M, state="STOPPED", state_changed_at=NOW - GAP),
        DestroyMachine("m"),
    ),
    (
        "stopped, no timer, registered",
        replace(M, origin="REGISTERED", state="STOPPED", state_changed_at=NOW - GAP),
        Refuse(RefusalReason.NOT_OURS),
    ),
    # A start the provider refused: STOPPED again, first_observed_at cleared by the start's
    # intent. Its grace runs from its stop, long past.
    (
        "stopped, no timer, never observed running (a refused start)",
        replace(M, state="STOPPED", state_changed_at=NOW - GAP, first_observed_at=None),
        DestroyMachine("m"),
    ),
    (
        "stopped with a timer, never observed running: the grace still holds",
        replace(M, state="STOPPED", destroy_due_at=PAST, first_observed_at=None),
        Refuse(RefusalReason.IN_GRACE_WINDOW),
    ),
    ("running, no timer, long unchanged: nothing", replace(M, state_changed_at=NOW - 10 * GAP), None),
    (
        "stopping, no timer, long unchanged: nothing",
        replace(M, state="STOPPING", state_changed_at=NOW - 10 * GAP),
        None,
    ),
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


def test_the_stopped_for_gap_is_the_chains_own() -> None:
    s = Settings(idle_stop_after_s=600, idle_destroy_after_s=3600)
    assert s.auto_destroy_policy().stopped_for == timedelta(seconds=3000)
    assert Settings().auto_destroy_policy().stopped_for == GAP


def test_the_claim_says_which_rule_made_the_machine_due() -> None:
    policy = AutoDestroyPolicy()
    armed = replace(M, state="STOPPED", destroy_due_at=PAST)
    claim = auto_destroy.claim(NOW, armed, DestroyMachine("m"), policy)
    assert claim.why == f"idle (STOPPED), destroy due at {PAST:%Y-%m-%d %H:%M:%S}"
    assert claim.first_sign == PAST - policy.destroy_after
    stopped_at = NOW - GAP
    unarmed = replace(M, state="STOPPED", state_changed_at=stopped_at)
    claim = auto_destroy.claim(NOW, unarmed, DestroyMachine("m"), policy)
    assert claim.why.startswith(f"stopped since {stopped_at:%Y-%m-%d %H:%M:%S} with no destroy timer")
    assert claim.first_sign == stopped_at
    assert auto_destroy.due_at(unarmed, policy) == stopped_at + GAP
    assert auto_destroy.due_at(replace(unarmed, destroy_due_at=PAST), policy) == PAST  # the timer rules
