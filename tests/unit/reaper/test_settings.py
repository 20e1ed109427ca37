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


def test_destroy_must_fall_due_after_stop() -> None:
    with pytest.raises(ValidationError, match="stop"):
        Settings(idle_stop_after_s=600, idle_destroy_after_s=600)
