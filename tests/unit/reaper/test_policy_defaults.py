"""Each net's policy dataclass defaults to what the reaper's Settings default to.

Production builds every policy from Settings (``settings.*_policy()``); the dataclass
defaults are what tests and benchmarks build with. A default changed in one place and not
the other would have them test a net the reaper does not run — so they must agree.
"""

from __future__ import annotations

from gpufleet.common.outcome_policy import OutcomePolicy
from gpufleet.reaper import (
    auto_destroy,
    auto_stop,
    boot_failure,
    gpu_fault,
    idle_scanner,
    lost_detector,
    provision_deadline,
    stuck_transition,
    went_silent,
)
from gpufleet.reaper.settings import Settings


def test_every_policys_defaults_are_the_settings_defaults() -> None:
    s = Settings.model_construct()
    assert s.idle_policy() == idle_scanner.IdlePolicy()
    assert s.auto_stop_policy() == auto_stop.AutoStopPolicy()
    assert s.auto_destroy_policy() == auto_destroy.AutoDestroyPolicy()
    assert s.provision_deadline_policy() == provision_deadline.ProvisionDeadlinePolicy()
    assert s.boot_failure_policy() == boot_failure.BootFailurePolicy()
    assert s.went_silent_policy() == went_silent.WentSilentPolicy()
    assert s.lost_policy() == lost_detector.LostPolicy()
    assert s.stuck_policy() == stuck_transition.StuckPolicy()
    assert s.gpu_fault_policy() == gpu_fault.GpuFaultPolicy()
    assert s.outcome_policy() == OutcomePolicy()
