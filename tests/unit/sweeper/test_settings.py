"""The sweeper's settings: defaults from DESIGN §1/§4 and their env names."""

from __future__ import annotations

import pytest

from gpufleet.sweeper.settings import Settings


def test_defaults() -> None:
    s = Settings()
    assert s.listen_address == "127.0.0.1:50054"
    assert s.inventory_reconcile_every_s == 60.0


def test_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_INVENTORY_RECONCILE_EVERY_S", "5")
    assert Settings().inventory_reconcile_every_s == 5.0
