"""Live utilisation samples: the idle scanner's only input (DESIGN §4, the money chain).

One interface, two implementations chosen once at start-up: :class:`NvmlSampler` reads
the GPUs through NVML (``nvidia-ml-py``; the only NVML code in gpufleet), and
:class:`SimulatedSampler` — on a machine with no GPU or no driver — reports what the
machine's running jobs would do to one. Either way a sample also carries the running
attempts and the StartJob/CancelJob calls since the previous sample, so any traffic keeps
a machine from being called idle, whatever the GPU reads.

Besides the SM utilisation, a sample carries the video encoder (NVENC), decoder (NVDEC)
and memory utilisation: an encode-bound phase of a video job can read near 0 % GPU
utilisation while NVENC is busy (NVIDIA's exporter reports ``ENC_UTIL``/``DEC_UTIL``
apart for the same reason), and the idle scanner counts each of them as traffic.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from gpufleet.common.errors import Unavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    gpu_utilization_percent: float
    running_attempts: int
    requests_since_last_sample: int
    sampler_name: str
    encoder_utilization_percent: float = 0.0
    decoder_utilization_percent: float = 0.0
    memory_utilization_percent: float = 0.0


@dataclass(frozen=True)
class Reading:
    """One look at every GPU: each engine's mean over the devices, in percent."""

    gpu: float
    memory: float
    encoder: float
    decoder: float


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class MachineActivity(Protocol):
    """What the machine is doing, apart from its GPU."""

    def running_attempts(self) -> int:
        """Attempts accepted and not ended."""
        ...

    def take_requests(self) -> int:
        """StartJob/CancelJob calls since the previous call of this method (and reset)."""
        ...


class UtilizationSampler(Protocol):
    name: str

    def sample(self, window: timedelta) -> Sample:
        """Utilisation over ``window`` (clock time), with the machine's activity."""
        ...


class RequestCounter:
    """Counts calls between samples; thread-safe (gRPC handlers run on a pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def add(self) -> None:
        with self._lock:
            self._count += 1

    def take(self) -> int:
        with self._lock:
            count, self._count = self._count, 0
            return count


class NvmlSampler:
    """Average utilisation (SM, memory, NVENC, NVDEC) over every device, over several
    readings in the window.

    NVML's own figure is a percentage of its last sample period, so readings are spread
    over the window in real time: ``real_seconds`` converts the clock window (a sped-up
    demo clock shortens it) and ``pause`` waits, both injected so tests need no waiting.
    """

    name = "nvml"

    def __init__(
        self,
        nvml: Any,
        activity: MachineActivity,
        *,
        real_seconds: Callable[[float], float],
        pause: Callable[[float], object],
        readings: int = 5,
    ) -> None:
        self.nvml = nvml
        self.activity = activity
        self.real_seconds = real_seconds
        self.pause = pause
        self.readings = max(1, readings)
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def _engine(self, read: Callable[[Any], list[int]], handle: Any) -> float:
        """An NVENC/NVDEC reading; a GPU without that engine (NOT_SUPPORTED) reads 0."""
        try:
            return float(read(handle)[0])
        except self.nvml.NVMLError_NotSupported:
            return 0.0

    def _read(self) -> Reading:
        rates = [self.nvml.nvmlDeviceGetUtilizationRates(h) for h in self.handles]
        return Reading(
            gpu=_mean([float(r.gpu) for r in rates]),
            memory=_mean([float(r.memory) for r in rates]),
            encoder=_mean([self._engine(self.nvml.nvmlDeviceGetEncoderUtilization, h) for h in self.handles]),
            decoder=_mean([self._engine(self.nvml.nvmlDeviceGetDecoderUtilization, h) for h in self.handles]),
        )

    def sample(self, window: timedelta) -> Sample:
        interval = self.real_seconds(window.total_seconds()) / self.readings
        values: list[Reading] = []
        try:
            for index in range(self.readings):
                if index:
                    self.pause(interval)
                values.append(self._read())
        except self.nvml.NVMLError as err:
            # A GPU that cannot be read is no evidence of idleness: the caller fails safe.
            raise Unavailable(f"NVML could not read utilisation: {err}") from err
        return Sample(
            gpu_utilization_percent=_mean([v.gpu for v in values]),
            running_attempts=self.activity.running_attempts(),
            requests_since_last_sample=self.activity.take_requests(),
            sampler_name=self.name,
            encoder_utilization_percent=_mean([v.encoder for v in values]),
            decoder_utilization_percent=_mean([v.decoder for v in values]),
            memory_utilization_percent=_mean([v.memory for v in values]),
        )


class SimulatedSampler:
    """A GPU-less machine's stand-in: busy (about ``busy_percent``, with noise) while any
    attempt runs, 0 when none does — what a GPU under the real pipeline would show."""

    name = "simulated"

    def __init__(
        self,
        activity: MachineActivity,
        rng: random.Random | None = None,
        *,
        busy_percent: float = 85.0,
        noise_percent: float = 5.0,
    ) -> None:
        self.activity = activity
        self.rng = rng or random.Random()
        self.busy_percent = busy_percent
        self.noise_percent = noise_percent

    def sample(self, window: timedelta) -> Sample:
        running = self.activity.running_attempts()
        utilization = 0.0
        if running:
            noisy = self.busy_percent + self.rng.uniform(-self.noise_percent, self.noise_percent)
            utilization = min(100.0, max(0.0, noisy))
        return Sample(
            gpu_utilization_percent=utilization,
            running_attempts=running,
            requests_since_last_sample=self.activity.take_requests(),
            sampler_name=self.name,
        )


def load_pynvml() -> Any:
    import pynvml  # the only NVML import in gpufleet (import-linter keeps it here)

    return pynvml


def choose_sampler(
    activity: MachineActivity,
    *,
    load_nvml: Callable[[], Any],
    real_seconds: Callable[[float], float],
    pause: Callable[[float], object],
) -> UtilizationSampler:
    """NVML when it initialises and sees at least one GPU; otherwise the simulated one."""
    try:
        nvml = load_nvml()
        nvml.nvmlInit()
    except Exception as err:  # no library, no driver, no device node: all mean "no NVML"
        log.info("NVML unavailable (%s); using the simulated sampler", err)
        return SimulatedSampler(activity)
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if count > 0:
            sampler = NvmlSampler(nvml, activity, real_seconds=real_seconds, pause=pause)
            log.info("NVML sees %d GPU(s); using the NVML sampler", count)
            return sampler
        reason = "no GPU present"
    except Exception as err:
        reason = f"NVML failed after init: {err}"
    log.info("%s; using the simulated sampler", reason)
    try:
        nvml.nvmlShutdown()
    except Exception as err:
        log.debug("nvmlShutdown failed: %s", err)
    return SimulatedSampler(activity)
