"""Samplers: NVML against a fake pynvml module passed in (no GPU here), the simulated
sampler, and the choice between them at start-up."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpufleet.agent.samplers import (
    NvmlSampler,
    RequestCounter,
    SimulatedSampler,
    choose_sampler,
)
from gpufleet.common.errors import Unavailable
from tests.support.nvml_fake import FakeGpus, load_fake_pynvml


class FakeActivity:
    def __init__(self, running: int = 0, requests: int = 0) -> None:
        self.running = running
        self.counter = RequestCounter()
        for _ in range(requests):
            self.counter.add()

    def running_attempts(self) -> int:
        return self.running

    def take_requests(self) -> int:
        return self.counter.take()


class FakeNvml:
    """The slice of pynvml the agent uses; readings[i][d] is device d's i-th reading."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def __init__(
        self,
        readings: list[list[int]],
        *,
        init_error: Exception | None = None,
        count_error: Exception | None = None,
        fail_on_read: int | None = None,
    ) -> None:
        self.readings = readings
        self.init_error = init_error
        self.count_error = count_error
        self.fail_on_read = fail_on_read
        self.reads = 0
        self.shutdowns = 0
        self.devices = len(readings[0]) if readings else 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error:
            raise self.count_error
        return self.devices

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        row = self.reads // self.devices
        if self.fail_on_read is not None and row == self.fail_on_read:
            raise self.NVMLError("GPU is lost")
        self.reads += 1
        return SimpleNamespace(gpu=self.readings[row][handle], memory=0)

    def nvmlDeviceGetEncoderUtilization(self, handle: int) -> list[int]:
        return [0, 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle: int) -> list[int]:
        raise self.NVMLError_NotSupported()  # a GPU without NVDEC reads 0


def nvml_sampler(nvml: FakeNvml, activity: FakeActivity, pauses: list[float], readings: int) -> NvmlSampler:
    return NvmlSampler(nvml, activity, real_seconds=lambda s: s / 10, pause=pauses.append, readings=readings)


def test_nvml_averages_every_gpu_over_the_window() -> None:
    nvml = FakeNvml([[90, 70], [50, 30], [10, 10]])
    pauses: list[float] = []
    sample = nvml_sampler(nvml, FakeActivity(running=2, requests=3), pauses, readings=3).sample(
        timedelta(seconds=6)
    )
    assert sample.gpu_utilization_percent == pytest.approx((80 + 40 + 10) / 3)
    assert sample.running_attempts == 2
    assert sample.requests_since_last_sample == 3
    assert sample.sampler_name == "nvml"
    # Readings spread over the window's real duration (6 clock s -> 0.6 real s here).
    assert pauses == pytest.approx([0.2, 0.2])


def test_nvml_sample_carries_encoder_decoder_and_memory(tmp_path: Path) -> None:
    """An encode-bound phase: the SMs read 0 %, NVENC 60 % — the sample says so."""
    gpus = FakeGpus(tmp_path / "nvml.json", devices=2)
    gpus.set(0, gpu=0, encoder=60, decoder=10, memory=4)
    gpus.set(1, gpu=0, encoder=20, decoder=0, memory=2)
    nvml = load_fake_pynvml(gpus)
    nvml.nvmlInit()
    sampler = NvmlSampler(nvml, FakeActivity(), real_seconds=lambda s: s, pause=lambda s: None, readings=2)
    sample = sampler.sample(timedelta(seconds=2))
    assert sample.gpu_utilization_percent == 0
    assert sample.encoder_utilization_percent == pytest.approx(40)
    assert sample.decoder_utilization_percent == pytest.approx(5)
    assert sample.memory_utilization_percent == pytest.approx(3)


def test_a_lost_gpu_is_unavailable_not_idle(tmp_path: Path) -> None:
    gpus = FakeGpus(tmp_path / "nvml.json")
    nvml = load_fake_pynvml(gpus)
    nvml.nvmlInit()
    sampler = NvmlSampler(nvml, FakeActivity(), real_seconds=lambda s: s, pause=lambda s: None, readings=1)
    gpus.set(0, lost=True)
    with pytest.raises(Unavailable, match="GPU is lost"):
        sampler.sample(timedelta(seconds=1))


def test_nvml_read_failure_is_unavailable_not_idle() -> None:
    nvml = FakeNvml([[90], [0]], fail_on_read=1)
    with pytest.raises(Unavailable):
        nvml_sampler(nvml, FakeActivity(), [], readings=2).sample(timedelta(seconds=2))


def test_requests_are_counted_since_the_previous_sample() -> None:
    activity = FakeActivity(requests=2)
    sampler = SimulatedSampler(activity, random.Random(1))
    assert sampler.sample(timedelta(seconds=1)).requests_since_last_sample == 2
    assert sampler.sample(timedelta(seconds=1)).requests_since_last_sample == 0
    activity.counter.add()
    assert sampler.sample(timedelta(seconds=1)).requests_since_last_sample == 1


@pytest.mark.parametrize(("running", "low", "high"), [(0, 0.0, 0.0), (1, 80.0, 90.0), (3, 80.0, 90.0)])
def test_simulated_sampler_reports_what_running_jobs_do(running: int, low: float, high: float) -> None:
    sampler = SimulatedSampler(FakeActivity(running=running), random.Random(7))
    for _ in range(20):
        sample = sampler.sample(timedelta(seconds=2))
        assert low <= sample.gpu_utilization_percent <= high
        assert sample.running_attempts == running
        assert sample.sampler_name == "simulated"


def choose(load: object) -> object:
    def loader() -> object:
        if isinstance(load, Exception):
            raise load
        return load

    return choose_sampler(FakeActivity(), load_nvml=loader, real_seconds=lambda s: s, pause=lambda s: None)


def test_a_machine_with_a_gpu_uses_nvml() -> None:
    nvml = FakeNvml([[42, 42]])
    sampler = choose(nvml)
    assert isinstance(sampler, NvmlSampler)
    assert sampler.name == "nvml"
    assert nvml.shutdowns == 0


@pytest.mark.parametrize("case", ["no library", "no driver", "no gpu", "count fails"])
def test_a_machine_without_a_usable_gpu_is_simulated(case: str) -> None:
    nvml = FakeNvml([[]] if case == "no gpu" else [[1]])
    load: object = nvml
    if case == "no library":
        load = ImportError("No module named 'pynvml'")
    elif case == "no driver":
        nvml.init_error = FakeNvml.NVMLError("NVML Shared Library Not Found")
    elif case == "count fails":
        nvml.count_error = FakeNvml.NVMLError("Unknown Error")
    sampler = choose(load)
    assert isinstance(sampler, SimulatedSampler)
    if case in ("no gpu", "count fails"):
        assert nvml.shutdowns == 1  # initialised, so released again
