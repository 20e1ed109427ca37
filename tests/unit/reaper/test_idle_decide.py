"""The idle scanner's decision, from a table: quiet arms once, traffic always clears."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.reaper.idle_scanner import (
    ArmIdleTimers,
    ClearIdleTimers,
    IdleAction,
    IdlePolicy,
    ProbeFailed,
    ProbeSucceeded,
    UtilisationSample,
    decide,
)
from gpufleet.reaper.refusal import MachineSnapshot

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POLICY = IdlePolicy(
    stop_after=timedelta(minutes=5),
    destroy_after=timedelta(hours=2),
    gpu_busy_percent=5.0,
    engine_busy_percent=1.0,
)
EARLIER = NOW - timedelta(minutes=1)

READY = MachineSnapshot(
    machine_id="m",
    origin="PROVISIONED",
    managed=True,
    state="READY",
    intent="RUNNING",
    workload_class="REPORTING",
    live_attempts=0,
)
ARMED = replace(READY, stop_due_at=EARLIER + POLICY.stop_after, destroy_due_at=EARLIER + POLICY.destroy_after)
QUIET = UtilisationSample(gpu_utilization_percent=4.9, running_attempts=0, requests_since_last_sample=0)
UNDER_THE_FLOOR = replace(
    QUIET, encoder_utilization_percent=0.9, decoder_utilization_percent=0.9, memory_utilization_percent=0.9
)

ARM = ArmIdleTimers(stop_due_at=NOW + timedelta(minutes=5), destroy_due_at=NOW + timedelta(hours=2))
OK = ProbeSucceeded(NOW)

CASES: list[tuple[str, MachineSnapshot, UtilisationSample | None, list[IdleAction]]] = [
    ("quiet arms both, stop first", READY, QUIET, [OK, ARM]),
    ("quiet never pushes armed timers", ARMED, QUIET, [OK]),
    ("quiet with only destroy armed leaves it", replace(READY, destroy_due_at=NOW), QUIET, [OK]),
    (
        "gpu at threshold is traffic",
        ARMED,
        replace(QUIET, gpu_utilization_percent=5.0),
        [OK, ClearIdleTimers()],
    ),
    (
        "an encode-bound phase is traffic (SM 0 %, NVENC 60 %)",
        ARMED,
        replace(QUIET, gpu_utilization_percent=0.0, encoder_utilization_percent=60.0),
        [OK, ClearIdleTimers()],
    ),
    (
        "a decoder at the floor is traffic",
        ARMED,
        replace(QUIET, decoder_utilization_percent=1.0),
        [OK, ClearIdleTimers()],
    ),
    (
        "memory traffic at the floor clears even when nothing is armed",
        READY,
        replace(QUIET, memory_utilization_percent=1.0),
        [OK, ClearIdleTimers()],
    ),
    (
        "engines under the floor stay quiet",
        READY,
        replace(
            QUIET,
            encoder_utilization_percent=0.9,
            decoder_utilization_percent=0.9,
            memory_utilization_percent=0.9,
        ),
        [OK, ARM],
    ),
    ("a running attempt is traffic", ARMED, replace(QUIET, running_attempts=1), [OK, ClearIdleTimers()]),
    ("a request is traffic", ARMED, replace(QUIET, requests_since_last_sample=1), [OK, ClearIdleTimers()]),
    (
        "a live attempt recorded here is traffic",
        replace(ARMED, live_attempts=1),
        QUIET,
        [OK, ClearIdleTimers()],
    ),
    (
        "traffic clears even when nothing is armed",
        READY,
        replace(QUIET, requests_since_last_sample=3),
        [OK, ClearIdleTimers()],
    ),
    (
        "traffic clears in a state nobody anticipated",
        replace(ARMED, state="WEIRD"),
        replace(QUIET, running_attempts=2),
        [OK, ClearIdleTimers()],
    ),
    (
        "traffic clears on a stopped machine",
        replace(ARMED, state="STOPPED"),
        replace(QUIET, gpu_utilization_percent=90.0),
        [OK, ClearIdleTimers()],
    ),
    ("quiet never arms a machine that is not running", replace(READY, state="STOPPING"), QUIET, [OK]),
    # A booting machine is quiet because it is still pulling its image: the boot nets own it.
    ("quiet never arms a booting machine", replace(READY, state="BOOTING"), QUIET, [OK]),
    ("quiet arms a draining machine", replace(READY, state="DRAINING"), QUIET, [OK, ARM]),
    (
        "traffic clears a booting machine",
        replace(ARMED, state="BOOTING"),
        replace(QUIET, requests_since_last_sample=1),
        [OK, ClearIdleTimers()],
    ),
    ("quiet never arms an unknown state", replace(READY, state="WEIRD"), QUIET, [OK]),
    ("unreachable: no timer change, probe failed", ARMED, None, [ProbeFailed(NOW)]),
    ("unreachable stopped machine: nothing at all", replace(ARMED, state="STOPPED"), None, []),
]


@pytest.mark.parametrize(("machine", "sample", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(
    machine: MachineSnapshot, sample: UtilisationSample | None, expected: list[IdleAction]
) -> None:
    assert decide(NOW, machine, sample, POLICY) == expected


def test_the_clearing_write_has_no_condition_but_the_id() -> None:
    from gpufleet.reaper.idle_scanner import clear_idle_timers

    sql = " ".join(str(clear_idle_timers("m-1").compile()).split())
    assert sql == (
        "UPDATE machines SET stop_due_at=:stop_due_at, destroy_due_at=:destroy_due_at "
        "WHERE machines.id = :id_1"
    )
