"""The GPU check at slot start through a real agent (daemon, worker, runner) whose ``import
pynvml`` finds the fake NVML: a GPU that initialised when the agent started but fails
every initialisation since ends the attempt as ours (INFRA_ERROR, the job never run), and
the machine's GPU health — in Probe and in the worker's heartbeat — carries the critical
``init_failed`` finding that gets it cordoned and replaced."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.v1 import job_pb2, machine_pb2
from tests.integration.agent.conftest import AgentLauncher, AgentProcess, start_request
from tests.integration.agent.fake_scheduler import FakeWorkerService, wait_for
from tests.support.nvml_fake import FakeGpus, agent_env, inherited_pythonpath


@pytest.fixture
def gpus(tmp_path: Path) -> FakeGpus:
    return FakeGpus(tmp_path / "nvml.json", devices=1)


@pytest.fixture
def agent(launcher: AgentLauncher, gpus: FakeGpus, tmp_path: Path) -> Iterator[AgentProcess]:
    yield launcher.start(
        tmp_path / "state",
        slots=1,
        machine_id="gpu-machine",
        extra_env={
            **agent_env(inherited_pythonpath(), gpus),
            "GPUFLEET_GPU_HEALTH_POLL_S": "0.1",
            "GPUFLEET_GPU_INIT_RETRY_AFTER_S": "0.05",
        },
    )


def test_an_attempt_on_a_gpu_that_never_initialises_is_ours_and_reported(
    agent: AgentProcess, gpus: FakeGpus, fake_scheduler: FakeWorkerService
) -> None:
    with agent.client() as client:
        probe = client.probe()
        assert probe.sampler == "nvml"  # the fake was loaded, and initialised at start
        assert probe.gpu_health.state == machine_pb2.GPU_HEALTH_STATE_OK

        gpus.init_failures("always")  # from now on, every process's nvmlInit fails
        since = time.monotonic()
        client.start_job(start_request("gpu-1", duration_s=5))

        done = wait_for(lambda: fake_scheduler.completion("gpu-1"), what="the attempt's completion")
        assert done.outcome == job_pb2.ATTEMPT_STATE_INFRA_ERROR
        assert "could not be initialised at slot start" in done.message
        assert "failed twice" in done.message
        filed = agent.state_dir / "finished" / "gpu-1"
        wait_for(filed.exists, what="the attempt filed away")
        assert not (filed / "job.log").exists()  # the tenant's job never started

        def critical() -> machine_pb2.GpuHealth | None:
            health = client.probe().gpu_health
            return health if health.state == machine_pb2.GPU_HEALTH_STATE_CRITICAL else None

        health = wait_for(critical, timeout=10, what="Probe reporting the init failure")
    assert [(f.kind, f.severity) for f in health.findings] == [
        ("init_failed", machine_pb2.GPU_FINDING_SEVERITY_CRITICAL)
    ]

    def reported() -> machine_pb2.GpuHealth | None:
        for beat in fake_scheduler.heartbeats_since(since):
            beat_health = beat.gpu_health
            if beat_health is not None and beat_health.state == machine_pb2.GPU_HEALTH_STATE_CRITICAL:
                return beat_health
        return None

    beat = wait_for(reported, timeout=10, what="a heartbeat carrying the init failure")
    assert [f.kind for f in beat.findings] == ["init_failed"]
