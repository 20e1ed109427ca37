"""GPU health: the severity table, and the watcher against the faithful fake NVML (no GPU
here). Each test drives the fake's state file as a failing GPU would change it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.agent.gpu_health import (
    CRITICAL_XIDS,
    GpuHealthWatcher,
    HealthPolicy,
    HealthState,
    Kind,
    Severity,
    classify,
    health_file,
    load_report,
    to_proto,
)
from gpufleet.common.clock import ManualClock
from gpufleet.v1 import machine_pb2
from tests.support.nvml_fake import FakeGpus, load_fake_pynvml

POLICY = HealthPolicy()


@pytest.mark.parametrize(
    ("kind", "code", "severity"),
    [
        *[(Kind.XID, xid, Severity.CRITICAL) for xid in (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)],
        # Usually the application's own fault (NVIDIA's catalogue: RESTART_APP).
        *[(Kind.XID, xid, Severity.WARNING) for xid in (13, 31, 43)],
        (Kind.ECC_UNCORRECTABLE, 1, Severity.CRITICAL),
        (Kind.ECC_UNCORRECTABLE, 0, None),
        (Kind.ECC_CORRECTABLE, 99, None),
        (Kind.ECC_CORRECTABLE, 100, Severity.WARNING),
        (Kind.ROW_REMAP_FAILURE, 0, Severity.CRITICAL),
        (Kind.ROW_REMAP_PENDING, 0, Severity.WARNING),
        (Kind.RETIRED_PAGES_PENDING, 0, Severity.WARNING),
        (Kind.GPU_LOST, 0, Severity.CRITICAL),
        (Kind.INIT_FAILED, 0, Severity.CRITICAL),
    ],
)
def test_severity_table(kind: Kind, code: int, severity: Severity | None) -> None:
    assert classify(kind, code, POLICY) == severity


def test_thresholds_come_from_the_policy() -> None:
    strict = HealthPolicy(
        critical_xids=CRITICAL_XIDS | {43}, ecc_uncorrectable_critical=3, ecc_correctable_warning=1
    )
    assert classify(Kind.XID, 43, strict) == Severity.CRITICAL
    assert classify(Kind.ECC_UNCORRECTABLE, 2, strict) is None
    assert classify(Kind.ECC_CORRECTABLE, 1, strict) == Severity.WARNING


@pytest.fixture
def gpus(tmp_path: Path) -> FakeGpus:
    return FakeGpus(tmp_path / "nvml.json", devices=2)


def watcher(gpus: FakeGpus, tmp_path: Path, pauses: list[float] | None = None) -> GpuHealthWatcher:
    clock = ManualClock(datetime(2026, 12, 1, tzinfo=UTC))
    return GpuHealthWatcher(
        load_fake_pynvml(gpus),
        clock,
        POLICY,
        report_path=health_file(tmp_path),
        pause=(pauses if pauses is not None else []).append,
    )


def test_a_healthy_machine_reports_ok(gpus: FakeGpus, tmp_path: Path) -> None:
    health = watcher(gpus, tmp_path)
    assert health.start()
    health.wait_for_event(0)
    report = health.report()
    assert report.state == HealthState.OK
    assert report.findings == ()
    assert load_report(health_file(tmp_path)) == report


def test_an_xid_79_event_is_critical(gpus: FakeGpus, tmp_path: Path) -> None:
    health = watcher(gpus, tmp_path)
    health.start()
    gpus.xid(1, 79)
    health.wait_for_event(0)
    report = health.report()
    assert report.state == HealthState.CRITICAL
    (finding,) = report.findings
    assert (finding.kind, finding.gpu_index, finding.code, finding.severity) == (
        Kind.XID,
        1,
        79,
        Severity.CRITICAL,
    )
    # The worker reads the same from the state folder.
    assert load_report(health_file(tmp_path)) == report


def test_an_xid_13_event_is_a_warning(gpus: FakeGpus, tmp_path: Path) -> None:
    health = watcher(gpus, tmp_path)
    health.start()
    gpus.xid(0, 13)
    gpus.xid(0, 13)
    health.wait_for_event(0)
    health.wait_for_event(0)
    report = health.report()
    assert report.state == HealthState.WARNING
    (finding,) = report.findings
    assert (finding.code, finding.count, finding.severity) == (13, 2, Severity.WARNING)


def test_an_uncorrectable_ecc_count_rising_is_critical(gpus: FakeGpus, tmp_path: Path) -> None:
    health = watcher(gpus, tmp_path)
    health.start()
    health.poll()
    assert health.report().state == HealthState.OK
    gpus.set(0, ecc_uncorrected_volatile=2)
    health.poll()
    report = health.report()
    assert report.state == HealthState.CRITICAL
    assert [(f.kind, f.gpu_index, f.code) for f in report.findings] == [(Kind.ECC_UNCORRECTABLE, 0, 2)]


def test_row_remap_failure_is_critical_and_pending_a_warning(gpus: FakeGpus, tmp_path: Path) -> None:
    health = watcher(gpus, tmp_path)
    health.start()
    gpus.set(0, remapped_rows={"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False})
    health.poll()
    assert health.report().state == HealthState.WARNING
    gpus.set(1, remapped_rows={"correctable": 0, "uncorrectable": 9, "pending": False, "failure": True})
    health.poll()
    assert [(f.kind, f.severity) for f in health.report().findings] == [
        (Kind.ROW_REMAP_FAILURE, Severity.CRITICAL),
        (Kind.ROW_REMAP_PENDING, Severity.WARNING),
    ]


def test_a_gpu_that_fell_off_the_bus_is_critical(gpus: FakeGpus, tmp_path: Path) -> None:
    health = watcher(gpus, tmp_path)
    health.start()
    gpus.set(1, lost=True)
    health.poll()
    assert [(f.kind, f.gpu_index) for f in health.report().critical()] == [(Kind.GPU_LOST, 1)]


def test_an_init_failure_then_success_is_not_reported(gpus: FakeGpus, tmp_path: Path) -> None:
    gpus.init_failures(1)
    pauses: list[float] = []
    health = watcher(gpus, tmp_path, pauses)
    assert health.start(retry_after_s=2.0)
    assert pauses == [2.0]  # one retry, after the pause
    assert health.report().state == HealthState.OK


def test_an_init_failure_twice_is_critical(gpus: FakeGpus, tmp_path: Path) -> None:
    gpus.init_failures("always")
    health = watcher(gpus, tmp_path)
    assert not health.start()
    report = health.report()
    assert report.state == HealthState.CRITICAL
    assert [(f.kind, f.gpu_index) for f in report.findings] == [(Kind.INIT_FAILED, -1)]
    assert load_report(health_file(tmp_path)) == report


def test_a_machine_without_nvml_is_unmonitored(tmp_path: Path) -> None:
    health = GpuHealthWatcher(
        load_fake_pynvml(tmp_path / "no-driver.json"),
        ManualClock(),
        POLICY,
        report_path=health_file(tmp_path),
    )
    assert not health.start()
    assert health.report().state == HealthState.UNMONITORED
    assert to_proto(health.report()).state == machine_pb2.GPU_HEALTH_STATE_UNMONITORED


def test_findings_outlive_an_agent_restart(gpus: FakeGpus, tmp_path: Path) -> None:
    """An Xid is seen once: a restarted agent must still report it."""
    first = watcher(gpus, tmp_path)
    first.start()
    gpus.xid(0, 48)
    first.wait_for_event(0)
    again = GpuHealthWatcher(
        load_fake_pynvml(gpus), ManualClock(), POLICY, previous=load_report(health_file(tmp_path))
    )
    again.start()
    assert [(f.kind, f.code) for f in again.report().critical()] == [(Kind.XID, 48)]


def test_the_report_as_the_heartbeat_carries_it(gpus: FakeGpus, tmp_path: Path) -> None:
    health = watcher(gpus, tmp_path)
    health.start()
    gpus.xid(0, 79)
    gpus.xid(1, 13)
    health.wait_for_event(0)
    health.wait_for_event(0)
    message = to_proto(health.report())
    assert message.state == machine_pb2.GPU_HEALTH_STATE_CRITICAL
    assert [(f.kind, f.code, f.severity) for f in message.findings] == [
        ("xid", 79, machine_pb2.GPU_FINDING_SEVERITY_CRITICAL),
        ("xid", 13, machine_pb2.GPU_FINDING_SEVERITY_WARNING),
    ]
    assert message.HasField("read_time")
