"""The local driver's FAULT INJECTION hook (drivers/local_faults.py), which the soak uses to
make the local cloud fail, slow down and lose answers, and to put its probe proxies in
front of agents. Off unless its file exists; each fault it injects is in its log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpufleet.common.provider_errors import Transient
from gpufleet.provisioner.drivers.base import InstanceRef, InstanceSpec, InstanceStatus, Offering, Provider
from gpufleet.provisioner.drivers.local_faults import FAULTS_FILE, FAULTS_LOG, PROXY_PORT_FILE
from tests.integration.provisioner.conftest import kill_local_machines, local_driver

OFFERING = Offering(
    provider=Provider.LOCAL, region="local", zone="local-a", instance_type="local-g2-standard-8", slots=2
)


@pytest.fixture
def root(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "machines"
    path.mkdir()
    yield path
    kill_local_machines(path)


def faults(root: Path, **settings: object) -> None:
    (root / FAULTS_FILE).write_text(json.dumps({"until": time.time() + 600, **settings}))


def injected(root: Path) -> list[tuple[str, str]]:
    path = root / FAULTS_LOG
    lines = path.read_text().splitlines() if path.exists() else []
    return [(json.loads(line)["op"], json.loads(line)["fault"]) for line in lines]


def spec(machine_id: str) -> InstanceSpec:
    return InstanceSpec(machine_id=machine_id, offering=OFFERING)


def test_without_the_file_nothing_is_injected(root: Path) -> None:
    driver = local_driver(root, "dep", agent="serve")
    info = driver.create(spec("m-1"))
    assert info.status is InstanceStatus.RUNNING and info.agent_address
    assert driver.destroy(InstanceRef(machine_id="m-1", offering=OFFERING))
    assert injected(root) == []


def test_a_failed_call_never_reaches_the_host(root: Path) -> None:
    driver = local_driver(root, "dep", agent="serve")
    faults(root, fail=1.0, ops=["create"])
    with pytest.raises(Transient, match="FAULT INJECTION"):
        driver.create(spec("m-1"))
    assert not (root / "m-1").exists()
    assert driver.list() == []  # other calls are not named: untouched
    assert injected(root) == [("create", "fail")]


def test_a_lost_answer_took_effect_and_a_retry_finds_the_same_machine(root: Path) -> None:
    driver = local_driver(root, "dep", agent="serve")
    faults(root, lose=1.0, ops=["create", "destroy"])
    with pytest.raises(Transient, match="answer was lost"):
        driver.create(spec("m-1"))
    (listed,) = driver.list()
    faults(root, until=0)  # the window is over
    again = driver.create(spec("m-1"))
    assert again.provider_instance_id == listed.provider_instance_id
    faults(root, lose=1.0, ops=["destroy"])
    with pytest.raises(Transient):
        driver.destroy(InstanceRef(machine_id="m-1", offering=OFFERING))
    assert not (root / "m-1").exists() and driver.list() == []
    assert injected(root) == [("create", "lose"), ("destroy", "lose")]


def test_a_slow_call_takes_its_delay_and_is_logged(root: Path) -> None:
    driver = local_driver(root, "dep", agent="serve")
    faults(root, slow_s=0.2, ops=["list"])
    driver.list()
    assert injected(root) == [("list", "slow")]


def test_with_probe_proxies_an_agent_is_reached_at_the_proxys_port(root: Path) -> None:
    faults(root, probe_proxy=True, until=0)  # no fault window, the proxies only
    driver = local_driver(root, "dep", agent="serve", agent_wait_s=0.5)
    info = driver.create(spec("m-1"))
    assert info.agent_address == ""  # no proxy opened yet: like a boot that has not answered
    (root / "m-1" / "disk" / PROXY_PORT_FILE).write_text("45999")
    assert driver.get(InstanceRef(machine_id="m-1", offering=OFFERING)).agent_address == "127.0.0.1:45999"
    driver.stop(InstanceRef(machine_id="m-1", offering=OFFERING))
    driver.start(InstanceRef(machine_id="m-1", offering=OFFERING))
    # A new boot is a new agent port: the old proxy's file is gone with it.
    assert not (root / "m-1" / "disk" / PROXY_PORT_FILE).exists()
