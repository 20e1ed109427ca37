"""GPU health through a real agent process whose ``import pynvml`` finds the fake NVML
(tests/support/fake_nvml first on its PYTHONPATH): a fault written to the fake's state
file from outside shows in Probe and in the worker's next heartbeat, and an encode-bound
GPU is busy in SampleUtilization."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.v1 import machine_pb2
from tests.integration.agent.conftest import AgentLauncher, AgentProcess
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
        },
    )


def test_a_fault_shows_in_probe_and_the_heartbeat(
    agent: AgentProcess, gpus: FakeGpus, fake_scheduler: FakeWorkerService
) -> None:
    with agent.client() as client:
        probe = client.probe()
        assert probe.sampler == "nvml"  # the fake was loaded, not the real bindings
        assert probe.gpu_health.state == machine_pb2.GPU_HEALTH_STATE_OK

        gpus.xid(0, 79)  # the GPU falls off the bus

        def critical() -> machine_pb2.GpuHealth | None:
            health = client.probe().gpu_health
            return health if health.state == machine_pb2.GPU_HEALTH_STATE_CRITICAL else None

        health = wait_for(critical, timeout=10, what="Probe reporting the Xid")
    assert [(f.kind, f.code, f.gpu_index) for f in health.findings] == [("xid", 79, 0)]
    assert health.findings[0].severity == machine_pb2.GPU_FINDING_SEVERITY_CRITICAL

    since = time.monotonic()

    def reported() -> machine_pb2.GpuHealth | None:
        for beat in fake_scheduler.heartbeats_since(since):
            health = beat.gpu_health
            if health is not None and health.state == machine_pb2.GPU_HEALTH_STATE_CRITICAL:
                return health
        return None

    beat = wait_for(reported, timeout=10, what="a heartbeat carrying the Xid")
    assert [(f.kind, f.code) for f in beat.findings] == [("xid", 79)]


def test_an_uncorrectable_ecc_error_is_reported(agent: AgentProcess, gpus: FakeGpus) -> None:
    gpus.set(0, ecc_uncorrected_volatile=1)
    with agent.client() as client:

        def critical() -> machine_pb2.GpuHealth | None:
            health = client.probe().gpu_health
            return health if health.state == machine_pb2.GPU_HEALTH_STATE_CRITICAL else None

        health = wait_for(critical, timeout=10, what="Probe reporting the ECC error")
    assert [(f.kind, f.code) for f in health.findings] == [("ecc_uncorrectable", 1)]


def test_an_encode_bound_gpu_samples_busy(agent: AgentProcess, gpus: FakeGpus) -> None:
    gpus.set(0, gpu=0, encoder=60, memory=3)
    with agent.client() as client:
        sample = client.sample()
    assert sample.sampler == "nvml"
    assert sample.gpu_utilization_percent == 0
    assert sample.encoder_utilization_percent == 60
    assert sample.memory_utilization_percent == 3
