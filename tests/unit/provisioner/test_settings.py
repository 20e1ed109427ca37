"""The provisioner's settings and the drivers they build."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpufleet.common.clock import ManualClock
from gpufleet.common.provider_errors import InsufficientCapacity
from gpufleet.provisioner.drivers.base import InstanceSpec, Offering, Provider
from gpufleet.provisioner.drivers.factory import build_drivers
from gpufleet.provisioner.settings import Settings


def test_defaults_are_the_embedded_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "GPUFLEET_DRIVERS",
        "GPUFLEET_LISTEN_ADDRESS",
        "GPUFLEET_LOCAL_ROOT",
        "GPUFLEET_CONFIG_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert settings.drivers == [Provider.LOCAL]
    assert settings.listen_address == "127.0.0.1:50053"
    assert settings.local_root == Path("var/machines")
    assert settings.local_agent_base_port == 50060


def test_environment_lists_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_DRIVERS", "local, sim")
    monkeypatch.setenv("GPUFLEET_SIM_STOCKOUT_ZONES", "us-central1-a,us-central1-b")
    monkeypatch.setenv("GPUFLEET_LOCAL_AGENT_COMMAND", '["/usr/bin/python3", "-m", "gpufleet.agent"]')
    settings = Settings()
    assert settings.drivers == [Provider.LOCAL, Provider.SIM]
    assert settings.sim_stockout_zones == ["us-central1-a", "us-central1-b"]
    assert settings.local_agent_command == ["/usr/bin/python3", "-m", "gpufleet.agent"]


def test_an_unknown_driver_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_DRIVERS", "local,azure")
    with pytest.raises(ValidationError):
        Settings()


def test_a_driver_not_in_this_build_fails_at_start() -> None:
    with pytest.raises(ValueError, match="GCP"):
        build_drivers(Settings(drivers=[Provider.GCP]), ManualClock())


def test_sim_settings_reach_the_sim_driver(tmp_path: Path) -> None:
    settings = Settings(drivers=[Provider.SIM], sim_stockout_zones=["sim-1a"], local_root=tmp_path)
    drivers = build_drivers(settings, ManualClock())
    assert set(drivers) == {Provider.SIM}
    offering = Offering(provider=Provider.SIM, region="sim-1", zone="sim-1a", instance_type="t", slots=1)
    with pytest.raises(InsufficientCapacity):
        drivers[Provider.SIM].create(InstanceSpec(machine_id="m-1", offering=offering))
