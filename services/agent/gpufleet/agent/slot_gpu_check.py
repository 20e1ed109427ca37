"""Before a tenant's job runs: can this machine's GPUs be initialised now?

The agent's watcher (gpufleet.agent.gpu_health) initialises NVML once, when the agent
starts; a machine can pass that and still fail later — on one cloud about 0.1 % of L4
CUDA/NVML initialisations fail, and a retry succeeds. A job started on such a GPU fails as
if it were the tenant's own fault and is charged for it. So the runner asks first: NVML
init and a device handle per visible GPU, through the same bindings the agent uses
(:func:`gpufleet.agent.samplers.load_pynvml`).

- Success: the job runs.
- A failure, then success after a short pause: the job runs; a warning is logged, nothing
  is reported (a transient hiccup is not a broken GPU).
- Two failures in a row: the attempt ends as *our* failure (INFRA_ERROR: uncharged,
  retried patiently by the job lifecycle) and a critical ``init_failed`` finding is
  recorded in the machine's GPU health report, which the worker's next heartbeat carries
  — the control plane then cordons the machine and the reaper's gpu_fault net replaces it.
- No NVML here (no bindings, or ``NVMLError_LibraryNotFound``: a machine without a GPU,
  the simulated sampler's case): the check is skipped, and the log says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from gpufleet.agent.gpu_health import HealthPolicy, Kind, health_file, record_finding
from gpufleet.agent.samplers import load_pynvml
from gpufleet.agent.settings import Settings
from gpufleet.common.clock import Clock

log = logging.getLogger(__name__)

# What the runner calls before the job: None when the job may run, else why it may not.
GpuCheck = Callable[[], "str | None"]


def no_check() -> str | None:
    """For a runner built without a check (tests of everything else)."""
    return None


class SlotGpuCheck:
    """One check of the GPUs, retried once (``pause`` waits real seconds: injected so a
    test never sleeps)."""

    def __init__(
        self,
        nvml: Any,
        clock: Clock,
        policy: HealthPolicy,
        report_path: Path,
        *,
        attempt_id: str,
        retry_after_s: float,
        pause: Callable[[float], object],
    ) -> None:
        self.nvml = nvml
        self.clock = clock
        self.policy = policy
        self.report_path = report_path
        self.attempt_id = attempt_id
        self.retry_after_s = retry_after_s
        self.pause = pause

    def __call__(self) -> str | None:
        if self.nvml is None:
            log.info("attempt %s: GPU initialisation check skipped: no NVML bindings", self.attempt_id)
            return None
        first = self._try_init()
        if first is None:
            return None
        if isinstance(first, self.nvml.NVMLError_LibraryNotFound):
            log.info("attempt %s: GPU initialisation check skipped: %s", self.attempt_id, first)
            return None
        log.warning(
            "attempt %s: GPU initialisation failed at slot start (%s); retrying once in %g s",
            self.attempt_id,
            first,
            self.retry_after_s,
            extra={"fields": {"attempt_id": self.attempt_id, "gpu_init": "retry"}},
        )
        self.pause(self.retry_after_s)
        second = self._try_init()
        if second is None:
            log.warning(
                "attempt %s: GPU initialisation succeeded on retry; the job runs, nothing reported",
                self.attempt_id,
                extra={"fields": {"attempt_id": self.attempt_id, "gpu_init": "retried_ok"}},
            )
            return None
        message = (
            f"the machine's GPUs could not be initialised at slot start: NVML failed twice "
            f"({first}; then {second}); the job did not run, and the machine is reported critical"
        )
        record_finding(self.report_path, Kind.INIT_FAILED, -1, 0, message, self.clock.now(), self.policy)
        return message

    def _try_init(self) -> Exception | None:
        """NVML init and a handle per GPU, then shut down again (init is reference counted;
        the runner holds nothing while its job runs)."""
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            return cast(Exception, err)
        try:
            for index in range(int(nvml.nvmlDeviceGetCount())):
                nvml.nvmlDeviceGetHandleByIndex(index)
            return None
        except nvml.NVMLError as err:
            return cast(Exception, err)
        finally:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as err:
                log.debug("nvmlShutdown: %s", err)


def _nvml_or_none() -> Any:
    try:
        return load_pynvml()
    except ImportError as err:
        log.debug("no NVML bindings: %s", err)
        return None


def from_settings(
    settings: Settings, clock: Clock, attempt_id: str, pause: Callable[[float], object]
) -> SlotGpuCheck:
    """The runner's check: the agent's bindings, policy, report file and retry pause."""
    return SlotGpuCheck(
        _nvml_or_none(),
        clock,
        settings.gpu_health_policy(),
        health_file(settings.agent_state_dir),
        attempt_id=attempt_id,
        retry_after_s=settings.gpu_init_retry_after_s,
        pause=pause,
    )
