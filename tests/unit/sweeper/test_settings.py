"""The sweeper's settings: defaults from DESIGN §1/§4 and their env names."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.sweeper.settings import Settings


def test_defaults() -> None:
    s = Settings()
    assert s.listen_address == "127.0.0.1:50054"
    assert s.inventory_reconcile_every_s == 60.0
    assert s.orphan_sweep_every_s == 300.0
    assert s.orphan_grace_s == 1800.0
    assert s.unlisted_rounds_before_incident == 3
    assert s.lost_retry_backoff_s == 30.0


def test_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_INVENTORY_RECONCILE_EVERY_S", "5")
    monkeypatch.setenv("GPUFLEET_ORPHAN_SWEEP_EVERY_S", "30")
    monkeypatch.setenv("GPUFLEET_ORPHAN_GRACE_S", "120")
    monkeypatch.setenv("GPUFLEET_UNLISTED_ROUNDS_BEFORE_INCIDENT", "5")
    monkeypatch.setenv("GPUFLEET_DEPLOYMENT_ID", "prod")
    s = Settings()
    assert (s.inventory_reconcile_every_s, s.orphan_sweep_every_s, s.unlisted_rounds_before_incident) == (
        5.0,
        30.0,
        5,
    )
    assert s.orphan_policy().grace == timedelta(seconds=120)
    assert s.orphan_policy().deployment_id == "prod"


def test_a_threshold_below_one_round_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_UNLISTED_ROUNDS_BEFORE_INCIDENT", "0")
    with pytest.raises(ValueError):
        Settings()
