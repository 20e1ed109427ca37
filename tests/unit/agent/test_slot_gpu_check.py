"""The runner's GPU check at slot start (gpufleet.agent.slot_gpu_check), through a real
runner and a real (tiny) job, against the file-driven fake NVML: a failure retried once
and passed runs the job; two fail the attempt as ours and report the machine critical;
no NVML skips the check."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.gpu_health import (
    GpuHealthWatcher,
    HealthPolicy,
    HealthState,
    Kind,
    Severity,
    health_file,
    load_report,
    record_finding,
)
from gpufleet.agent.runner import Runner
from gpufleet.agent.slot_gpu_check import SlotGpuCheck
from gpufleet.agent.specs import Outcome
from gpufleet.common.clock import ManualClock
from tests.support.nvml_fake import FakeGpus, load_fake_pynvml
from tests.unit.agent.factories import spec
from tests.unit.agent.test_runner import make_runner

JOB = "print('the job ran')"
AT = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
def gpus(tmp_path: Path) -> FakeGpus:
    return FakeGpus(tmp_path / "nvml.json", devices=2)


def runner_with_check(tmp_path: Path, nvml: Any, pauses: list[float]) -> Runner:
    clock = ManualClock(AT)
    runner = make_runner(tmp_path, spec("a-1"), JOB, clock)
    runner.gpu_check = SlotGpuCheck(
        nvml,
        clock,
        HealthPolicy(),
        health_file(tmp_path),
        attempt_id="a-1",
        retry_after_s=1.5,
        pause=pauses.append,
    )
    return runner


def test_a_healthy_gpu_runs_the_job_and_reports_nothing(gpus: FakeGpus, tmp_path: Path) -> None:
    pauses: list[float] = []
    runner = runner_with_check(tmp_path, load_fake_pynvml(gpus), pauses)
    result = runner.run()
    assert result.outcome is Outcome.SUCCEEDED
    assert runner.files.job_log.read_text() == "the job ran\n"
    assert pauses == []
    assert load_report(health_file(tmp_path)) is None


def test_one_failure_is_retried_and_the_job_runs(
    gpus: FakeGpus, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gpus.init_failures(1)
    pauses: list[float] = []
    runner = runner_with_check(tmp_path, load_fake_pynvml(gpus), pauses)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.slot_gpu_check"):
        result = runner.run()
    assert result.outcome is Outcome.SUCCEEDED
    assert runner.files.job_log.read_text() == "the job ran\n"
    assert pauses == [1.5]  # one retry, after the configured pause
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("retrying once" in w for w in warnings)
    assert any("succeeded on retry" in w for w in warnings)
    assert load_report(health_file(tmp_path)) is None  # nothing critical, nothing at all


def test_two_failures_end_the_attempt_as_ours_and_report_the_machine_critical(
    gpus: FakeGpus, tmp_path: Path
) -> None:
    gpus.init_failures("always")
    pauses: list[float] = []
    runner = runner_with_check(tmp_path, load_fake_pynvml(gpus), pauses)
    result = runner.run()
    assert result.outcome is Outcome.INFRA_ERROR  # uncharged, retried patiently elsewhere
    assert "GPUs could not be initialised at slot start" in result.message
    assert "failed twice" in result.message
    assert not runner.files.job_log.exists()  # the job never started
    assert pauses == [1.5]
    report = load_report(health_file(tmp_path))
    assert report is not None
    assert report.state == HealthState.CRITICAL
    [finding] = report.findings
    assert (finding.kind, finding.severity, finding.gpu_index) == (Kind.INIT_FAILED, Severity.CRITICAL, -1)
    assert finding.message == result.message


def test_a_gpu_whose_handle_fails_twice_fails_the_check(gpus: FakeGpus, tmp_path: Path) -> None:
    gpus.set(1, lost=True)  # init succeeds; the second GPU's handle does not
    runner = runner_with_check(tmp_path, load_fake_pynvml(gpus), [])
    result = runner.run()
    assert result.outcome is Outcome.INFRA_ERROR
    assert "GPU is lost" in result.message
    report = load_report(health_file(tmp_path))
    assert report is not None and report.state == HealthState.CRITICAL


@pytest.mark.parametrize("nvml", ["no bindings", "no library"])
def test_no_nvml_skips_the_check(nvml: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # No bindings at all, or bindings without the driver's library (the fake with no state
    # file behaves as pynvml does on a host without libnvidia-ml: LibraryNotFound).
    module = None if nvml == "no bindings" else load_fake_pynvml(tmp_path / "absent.json")
    pauses: list[float] = []
    runner = runner_with_check(tmp_path, module, pauses)
    with caplog.at_level(logging.INFO, logger="gpufleet.agent.slot_gpu_check"):
        result = runner.run()
    assert result.outcome is Outcome.SUCCEEDED
    assert pauses == []
    assert any("check skipped" in r.getMessage() for r in caplog.records)
    assert load_report(health_file(tmp_path)) is None


def test_the_watcher_keeps_a_finding_a_runner_recorded(gpus: FakeGpus, tmp_path: Path) -> None:
    """The runner and the agent's watcher write one file: the watcher's next write (every
    poll) must carry the runner's finding, and Probe (the watcher's report) show it."""
    path = health_file(tmp_path)
    watcher = GpuHealthWatcher(load_fake_pynvml(gpus), ManualClock(AT), HealthPolicy(), report_path=path)
    assert watcher.start()
    assert load_report(path) is not None
    record_finding(path, Kind.INIT_FAILED, -1, 0, "NVML failed twice", AT, HealthPolicy())
    watcher.poll()
    on_disk = load_report(path)
    assert on_disk is not None and on_disk.state == HealthState.CRITICAL
    assert [f.kind for f in on_disk.findings] == [Kind.INIT_FAILED]
    assert watcher.report() == on_disk
