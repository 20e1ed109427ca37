"""The first sign each net measures its detection latency from, and what one act records."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import pytest

from gpufleet.common.metrics.catalog import REAPER_DETECTION_LATENCY
from gpufleet.reaper.detection_latency import (
    DetectionLatency,
    boot_window_start,
    gpu_fault_reported,
    idle_since,
    last_report,
    probe_failing_since,
    provision_requested,
    transition_start,
)
from gpufleet.reaper.refusal import MachineSnapshot
from gpufleet.reaper.settings import Settings
from tests.support.metrics import MetricsProbe
from tests.unit.reaper.nets_fixtures import HEALTHY, NOW, ago

TWENTY_MIN = timedelta(minutes=20)

FIRST_SIGNS: list[
    tuple[str, Callable[[MachineSnapshot], datetime | None], MachineSnapshot, datetime | None]
] = [
    ("went_silent: the last report", last_report, HEALTHY, HEALTHY.worker_report_at),
    (
        "provision_deadline: the request",
        lambda m: provision_requested(m, TWENTY_MIN),
        HEALTHY,
        HEALTHY.requested_at,
    ),
    (
        "provision_deadline: no request time, so the deadline less its window",
        lambda m: provision_requested(m, TWENTY_MIN),
        dataclasses.replace(HEALTHY, requested_at=None, provision_deadline_at=ago(minutes=5)),
        ago(minutes=25),
    ),
    (
        "provision_deadline: neither",
        lambda m: provision_requested(m, TWENTY_MIN),
        dataclasses.replace(HEALTHY, requested_at=None, provision_deadline_at=None),
        None,
    ),
    ("boot_failure: this life's first observation", boot_window_start, HEALTHY, HEALTHY.first_observed_at),
    (
        "lost_detector: the first failed probe",
        probe_failing_since,
        dataclasses.replace(HEALTHY, probe_failed_since=ago(minutes=4)),
        ago(minutes=4),
    ),
    (
        "auto_stop: idle since the timer was armed",
        lambda m: idle_since(m.stop_due_at, timedelta(minutes=5)),
        dataclasses.replace(HEALTHY, stop_due_at=ago(seconds=30)),
        ago(minutes=5, seconds=30),
    ),
    (
        "auto_destroy: idle since the timer was armed",
        lambda m: idle_since(m.destroy_due_at, timedelta(hours=2)),
        dataclasses.replace(HEALTHY, destroy_due_at=ago(seconds=30)),
        ago(hours=2, seconds=30),
    ),
    ("auto_stop: no timer", lambda m: idle_since(m.stop_due_at, timedelta(minutes=5)), HEALTHY, None),
    (
        "stuck_transition: the transition's start",
        transition_start,
        dataclasses.replace(HEALTHY, state="STOPPING", state_changed_at=ago(minutes=11)),
        ago(minutes=11),
    ),
]


@pytest.mark.parametrize(
    ("case", "first_sign", "machine", "expected"), FIRST_SIGNS, ids=[c[0] for c in FIRST_SIGNS]
)
def test_each_nets_first_sign(
    case: str,
    first_sign: Callable[[MachineSnapshot], datetime | None],
    machine: MachineSnapshot,
    expected: datetime | None,
) -> None:
    assert first_sign(machine) == expected


@pytest.fixture
def probe() -> Iterator[MetricsProbe]:
    probe = MetricsProbe()
    yield probe
    probe.close()


def test_an_act_records_seconds_since_its_first_sign_by_net(probe: MetricsProbe) -> None:
    DetectionLatency("went_silent", probe.instruments).acted(ago(minutes=5), NOW)
    DetectionLatency("went_silent", probe.instruments).acted(ago(minutes=15), NOW)
    DetectionLatency("lost_detector", probe.instruments).acted(ago(minutes=3), NOW)
    points = probe.points(REAPER_DETECTION_LATENCY.name)
    assert {labels: (p.count, p.sum) for labels, p in points.items()} == {
        (("net", "went_silent"),): (2, 1200.0),
        (("net", "lost_detector"),): (1, 180.0),
    }


def test_an_unknown_first_sign_records_nothing_and_a_clock_skew_records_zero(probe: MetricsProbe) -> None:
    latency = DetectionLatency("boot_failure", probe.instruments)
    latency.acted(None, NOW)
    assert probe.points(REAPER_DETECTION_LATENCY.name) == {}
    latency.acted(NOW + timedelta(seconds=5), NOW)  # a first sign after the act: never negative
    [point] = probe.points(REAPER_DETECTION_LATENCY.name).values()
    assert (point.count, point.sum) == (1, 0.0)


def test_the_money_chain_dates_idle_since_with_the_idle_scanners_own_settings() -> None:
    """auto_stop and auto_destroy derive "idle since" from the windows the idle scanner arms
    with: the reaper's settings hand them the same ones."""
    s = Settings(idle_stop_after_s=120.0, idle_destroy_after_s=900.0)
    assert s.auto_stop_policy().stop_after == s.idle_policy().stop_after == timedelta(minutes=2)
    assert s.auto_destroy_policy().destroy_after == s.idle_policy().destroy_after == timedelta(minutes=15)


def test_gpu_fault_counts_from_the_control_planes_first_act_else_the_read() -> None:
    """gpu_fault: the first gpu_fault row (the cordon, on the control plane's clock); with
    none, when the stored findings were read; with neither, nothing is recorded."""
    assert gpu_fault_reported(ago(minutes=3), ago(seconds=5)) == ago(minutes=3)
    assert gpu_fault_reported(None, ago(seconds=5)) == ago(seconds=5)
    assert gpu_fault_reported(None, None) is None
