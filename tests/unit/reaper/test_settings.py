"""The reaper's settings: defaults from DESIGN §4, env names, and stop-before-destroy enforced."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from gpufleet.reaper.settings import Settings


def test_defaults_match_the_design(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings()
    assert s.listen_address == "127.0.0.1:50052"
    assert (s.idle_scan_every_s, s.auto_stop_every_s, s.auto_destroy_every_s) == (30.0, 30.0, 30.0)
    assert s.idle_policy().stop_after == timedelta(minutes=5)
    assert s.idle_policy().destroy_after == timedelta(hours=2)


def test_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_IDLE_STOP_AFTER_S", "60")
    monkeypatch.setenv("GPUFLEET_IDLE_DESTROY_AFTER_S", "600")
    monkeypatch.setenv("GPUFLEET_AUTO_STOP_GRACE_S", "0")
    monkeypatch.setenv("GPUFLEET_IDLE_GPU_BUSY_PERCENT", "12.5")
    s = Settings()
    assert s.idle_policy().stop_after == timedelta(minutes=1)
    assert s.idle_policy().destroy_after == timedelta(minutes=10)
    assert s.idle_policy().gpu_busy_percent == 12.5
    assert s.auto_stop_policy().grace == timedelta(0)


def test_provider_calls_have_a_bounded_pool_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings()
    assert (s.provider_call_workers, s.provider_call_drain_s) == (16, 10.0)
    monkeypatch.setenv("GPUFLEET_PROVIDER_CALL_WORKERS", "4")
    monkeypatch.setenv("GPUFLEET_PROVIDER_CALL_DRAIN_S", "0")
    s = Settings()
    assert (s.provider_call_workers, s.provider_call_drain_s) == (4, 0.0)
    with pytest.raises(ValidationError, match="provider_call_workers"):
        Settings(provider_call_workers=0)


def test_destroy_must_fall_due_after_stop() -> None:
    with pytest.raises(ValidationError, match="stop"):
        Settings(idle_stop_after_s=600, idle_destroy_after_s=600)


def test_the_nets_defaults_match_the_design() -> None:
    s = Settings()
    every = (
        s.provision_deadline_every_s,
        s.boot_failure_every_s,
        s.went_silent_every_s,
        s.lost_detector_every_s,
        s.stuck_transition_every_s,
    )
    assert every == (60.0, 60.0, 60.0, 60.0, 60.0)
    assert s.boot_failure_policy().window == timedelta(minutes=30)
    assert s.went_silent_policy().silent_after == timedelta(minutes=15)
    assert s.lost_policy().lost_after == timedelta(minutes=3)
    assert s.stuck_policy().stuck_after == timedelta(minutes=10)
    assert s.provision_deadline_policy().default_deadline == timedelta(minutes=20)
    outcomes = s.outcome_policy()
    assert (outcomes.offering_quarantine_ttl, outcomes.halt_ttl) == (timedelta(minutes=30), None)


def test_went_silent_under_its_floor_is_raised_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    monkeypatch.setenv("GPUFLEET_WENT_SILENT_AFTER_S", "60")
    with caplog.at_level(logging.WARNING, logger="gpufleet.reaper.settings"):
        s = Settings()
    assert s.went_silent_after_s == 300.0
    assert s.went_silent_policy().silent_after == timedelta(minutes=5)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "floor" in caplog.records[0].getMessage()


def test_the_nets_env_names(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "GPUFLEET_BOOT_WINDOW_S": "900",
        "GPUFLEET_LOST_AFTER_S": "120",
        "GPUFLEET_STUCK_TRANSITION_AFTER_S": "300",
        "GPUFLEET_WENT_SILENT_EVERY_S": "20",
        "GPUFLEET_OFFERING_QUARANTINE_TTL_S": "0",
        "GPUFLEET_HALT_PROVISIONING_TTL_S": "3600",
    }.items():
        monkeypatch.setenv(name, value)
    s = Settings()
    assert s.boot_failure_policy().window == timedelta(minutes=15)
    assert s.lost_policy().lost_after == timedelta(minutes=2)
    assert s.stuck_policy().stuck_after == timedelta(minutes=5)
    assert s.went_silent_every_s == 20.0
    assert s.outcome_policy().offering_quarantine_ttl is None
    assert s.outcome_policy().halt_ttl == timedelta(hours=1)
