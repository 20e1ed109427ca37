"""The soak's detection verdict without a database: what a machine was in the store at a
fault's time (``MachineWatch.state_at``) decides whether the lost and went-silent nets are
judged on it. A fault the chaos aimed at a machine still booting (the provider says
RUNNING as soon as its process is up) is no test of those nets; a fault on a machine in
service that nothing acted on in time is still late."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.soak_parts.chaos import Fault, Thresholds
from benchmarks.soak_parts.machine_watch import MachineWatch
from benchmarks.soak_parts.verdict import Verdict, judge_detections, not_in_service

T0 = 1_000_000.0  # the control plane's clock at the fault
LOST_DEADLINE = 290.0  # probe cadence + lost_after_s + lost cadence, as the chaos computes it

THRESHOLDS = Thresholds(
    lost_after_s=180.0,
    lost_every_s=60.0,
    probe_every_s=50.0,
    went_silent_after_s=300.0,
    went_silent_every_s=60.0,
    went_silent_grace_s=600.0,
    heartbeat_s=30.0,
    gpu_poll_real_s=5.0,
)


def watch_of(history: dict[str, list[tuple[float, str, bool, bool]]]) -> MachineWatch:
    return MachineWatch(sessions=None, clock_now=None, history=history)


def fault(cls: str = "pause_agent", machine: str = "m1", expect: str = "machine_lost") -> Fault:
    deadline = LOST_DEADLINE if expect == "machine_lost" else 360.0
    return Fault(
        cls=cls,
        at=0.0,
        virtual_at=T0,
        machine_id=machine,
        duration_s=38.2,
        expect=expect,
        deadline_virtual_s=deadline,
    )


def run(
    faults: list[Fault],
    history: dict[str, list[tuple[float, str, bool, bool]]],
    failures: list[Any] | None = None,
    virtual_end: float = T0 + 3600,
) -> Verdict:
    v = Verdict()
    machines = {m: SimpleNamespace(first_observed_at=None) for m in history}
    judge_detections(
        v, faults, THRESHOLDS, machines, failures or [], watch_of(history), virtual_end, slack_virtual_s=20.0
    )
    return v


# ---- MachineWatch.state_at ----------------------------------------------------------------


def test_state_at_is_the_last_read_at_or_before_the_time() -> None:
    watch = watch_of(
        {
            "m1": [
                (T0 - 100, "BOOTING", False, False),
                (T0 - 50, "READY", False, False),
                (T0 + 10, "READY", True, False),
            ]
        }
    )
    assert watch.state_at("m1", T0 - 101) is None  # not read yet
    assert watch.state_at("m1", T0 - 100) == ("BOOTING", False, False)
    assert watch.state_at("m1", T0 - 51) == ("BOOTING", False, False)
    assert watch.state_at("m1", T0) == ("READY", False, False)
    assert watch.state_at("m1", T0 + 10) == ("READY", True, False)
    assert watch.state_at("m1", T0 + 1e6) == ("READY", True, False)
    assert watch.state_at("other", T0) is None


# ---- the per-fault rule ------------------------------------------------------------------


@pytest.mark.parametrize("expect", ["machine_lost", "went_silent"])
@pytest.mark.parametrize(
    ("at_fault", "why"),
    [
        (None, "not yet read in the store"),
        (("PROVISIONING", False, False), "PROVISIONING"),
        (("BOOTING", False, False), "BOOTING"),
        (("STARTING", False, False), "STARTING"),
    ],
)
def test_a_machine_not_in_service_is_not_judged(
    expect: str, at_fault: tuple[str, bool, bool] | None, why: str
) -> None:
    assert not_in_service(expect, at_fault) == why


@pytest.mark.parametrize(
    "at_fault",
    [
        ("READY", False, False),
        ("DRAINING", False, False),
        # Already acted on: judged as before (acted on at the fault's own time).
        ("READY", True, False),
        ("READY", False, True),
        ("STOPPING", False, False),
        ("STOPPED", False, False),
        ("DESTROYED", False, False),
    ],
)
def test_a_machine_in_service_or_already_acted_on_is_judged(at_fault: tuple[str, bool, bool]) -> None:
    assert not_in_service("machine_lost", at_fault) is None
    assert not_in_service("went_silent", at_fault) is None


def test_other_expectations_are_judged_whatever_the_state() -> None:
    assert not_in_service("gpu_fault", ("BOOTING", False, False)) is None
    assert not_in_service("gpu_fault", None) is None


# ---- judge_detections ----------------------------------------------------------------------


def test_the_reported_false_late_detection_is_not_judged() -> None:
    # The 60-minute run's case: stopped by auto_stop, started again by the scale step, and
    # STARTING (then BOOTING) in the store when the agent was paused; acted on 575 s later.
    history = {
        "eb9c9d90": [
            (T0 - 400, "READY", False, False),
            (T0 - 200, "STOPPING", False, False),
            (T0 - 150, "STOPPED", False, False),
            (T0 - 30, "STARTING", False, False),
            (T0 + 40, "BOOTING", False, False),
            (T0 + 500, "READY", False, False),
            (T0 + 575, "STOPPING", False, False),
        ]
    }
    v = run([fault(machine="eb9c9d90")], history)
    assert v.figures["late_detections"] == 0
    assert v.figures["detections_judged"] == 0
    assert v.figures["detections_not_judged_not_in_service"] == 1
    (line,) = v.details["detections_not_judged_not_in_service (info)"]
    assert "eb9c9d90" in line and "STARTING" in line
    assert "late_detections" not in v.details


def test_a_ready_machine_nothing_acted_on_is_still_late() -> None:
    history = {"m1": [(T0 - 100, "READY", False, False)]}
    v = run([fault()], history)
    assert v.figures["late_detections"] == 1
    assert v.figures["detections_judged"] == 1
    assert v.figures["detections_not_judged_not_in_service"] == 0
    (line,) = v.details["late_detections"]
    assert "expected machine_lost within 310 s, acted on never" in line


def test_a_ready_machine_acted_on_after_the_deadline_is_late() -> None:
    history = {"m1": [(T0 - 100, "READY", False, False), (T0 + 575, "READY", True, False)]}
    v = run([fault()], history)
    assert v.figures["late_detections"] == 1
    assert "acted on after 575 s" in v.details["late_detections"][0]


def test_a_ready_machine_acted_on_in_time_is_on_time() -> None:
    history = {"m1": [(T0 - 100, "READY", False, False), (T0 + 250, "READY", True, False)]}
    v = run([fault()], history)
    assert v.figures["late_detections"] == 0
    assert v.figures["detections_judged"] == 1
    assert v.figures["detection_delay_max_s"] == {"pause_agent": 250.0}


def test_a_ledger_row_in_time_counts_as_acted_on() -> None:
    from datetime import UTC, datetime

    history = {"m1": [(T0 - 100, "DRAINING", False, False)]}
    row = SimpleNamespace(machine_id="m1", at=datetime.fromtimestamp(T0 + 120, UTC))
    v = run([fault(cls="kill_worker", expect="went_silent")], history, failures=[row])
    assert v.figures["late_detections"] == 0
    assert v.figures["detection_delay_max_s"] == {"kill_worker": 120.0}


def test_a_machine_already_lost_at_the_fault_is_judged_acted_on_at_once() -> None:
    history = {"m1": [(T0 - 100, "READY", False, False), (T0 - 10, "READY", True, False)]}
    v = run([fault()], history)
    assert v.figures["late_detections"] == 0
    assert v.figures["detections_judged"] == 1
    assert v.figures["detection_delay_max_s"] == {"pause_agent": 0.0}


def test_no_history_and_booting_worker_faults_are_not_judged_but_counted() -> None:
    history = {"m2": [(T0 - 5, "BOOTING", False, False)]}
    faults = [fault(machine="never-read"), fault(cls="kill_worker", machine="m2", expect="went_silent")]
    v = run(faults, history)
    assert v.figures["detections_not_judged_not_in_service"] == 2
    assert v.figures["late_detections"] == 0
    lines = v.details["detections_not_judged_not_in_service (info)"]
    assert "not yet read in the store" in lines[0] and "BOOTING" in lines[1]


def test_a_deadline_past_the_run_is_still_not_judged_run_ended() -> None:
    history = {"m1": [(T0 - 100, "READY", False, False)]}
    v = run([fault()], history, virtual_end=T0 + 100)
    assert v.figures["detections_not_judged_run_ended"] == 1
    assert v.figures["detections_judged"] == 0 and v.figures["late_detections"] == 0
