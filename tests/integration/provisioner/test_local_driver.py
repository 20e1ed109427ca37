"""What only the local driver promises: the machine folder, the agent's environment and
files, and that a machine's every process ends with it — while a provisioner restart
ends none of them. The real agent runs wherever it can; fake_agent.py plays the agents
that misbehave on purpose."""

from __future__ import annotations

import json
import pwd
import socket
import threading
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from cryptography import x509

from gpufleet.common.clients.agent import AgentClient
from gpufleet.common.errors import InvalidArgument
from gpufleet.common.trust.pki import machine_ca_subject
from gpufleet.provisioner.drivers.base import (
    InstanceInfo,
    InstanceRef,
    InstanceSpec,
    InstanceStatus,
    Offering,
    Provider,
)
from gpufleet.provisioner.drivers.local import LocalDriver
from tests.integration.provisioner.conftest import (
    agent_env,
    kill_group,
    kill_local_machines,
    local_driver,
    pid_alive,
)
from tests.support import tls

OFFERING = Offering(
    provider=Provider.LOCAL, region="local", zone="local-a", instance_type="local-g2-standard-8", slots=3
)


@pytest.fixture
def root(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "machines"
    yield path
    kill_local_machines(path)


def create(driver: LocalDriver, machine_id: str | None = None) -> InstanceInfo:
    return driver.create(InstanceSpec(machine_id=machine_id or str(uuid.uuid4()), offering=OFFERING))


def ref(machine_id: str) -> InstanceRef:
    return InstanceRef(machine_id=machine_id, offering=OFFERING)


def probe_machine_id(machine_id: str, address: str) -> str:
    """What the agent at ``address`` answers Probe with, dialled as ``machine_id``."""
    with AgentClient(machine_id, address, tls.transport("scheduler", "dep")) as client:
        return client.probe().machine_id


def read_int(path: Path) -> int:
    return int(path.read_text())


def test_machine_folder_and_the_agents_environment(root: Path) -> None:
    driver = local_driver(root, "dep", scheduler_address="127.0.0.1:50051")
    info = create(driver, "m-1")
    folder = root / "m-1"
    record = json.loads((folder / "instance.json").read_text())
    assert record["machine_id"] == "m-1"
    assert record["provider_instance_id"] == info.provider_instance_id
    assert info.provider_instance_id.startswith("local-")
    assert record["labels"] == {"gpufleet-deployment": "dep", "gpufleet-machine": "m-1"}
    assert datetime.fromisoformat(record["launch_time"]) == driver.clock.now() == info.launch_time
    assert record["status"] == "RUNNING"

    assert info.status is InstanceStatus.RUNNING
    assert info.agent_address == f"127.0.0.1:{read_int(folder / 'disk' / 'agent.port')}"
    with AgentClient("m-1", info.agent_address, tls.transport("scheduler", "dep")) as client:
        probe = client.probe()
    assert (probe.machine_id, probe.slots) == ("m-1", 3)
    assert (folder / "logs" / "agent.log").exists()

    env = agent_env(root, "m-1")
    assert env["GPUFLEET_MACHINE_ID"] == "m-1"
    assert env["GPUFLEET_LISTEN_ADDRESS"] == "127.0.0.1:0"
    assert env["GPUFLEET_AGENT_STATE_DIR"] == str((folder / "disk").resolve())
    assert env["GPUFLEET_SCHEDULER_ADDRESS"] == "127.0.0.1:50051"
    assert env["GPUFLEET_SLOTS"] == "3"
    assert env["GPUFLEET_DEPLOYMENT_ID"] == "dep"
    # Born with its own credential, in its own folder: a certificate naming this machine,
    # signed by the machine CA, and a key only its owner can read.
    cert = x509.load_pem_x509_certificate(Path(env["GPUFLEET_TLS_CERT_FILE"]).read_bytes())
    assert Path(env["GPUFLEET_TLS_CERT_FILE"]).parent == (folder / "tls").resolve()
    uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert uris.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://gpufleet.dep/machine/m-1"]
    assert cert.issuer == machine_ca_subject("dep")
    assert Path(env["GPUFLEET_TLS_KEY_FILE"]).stat().st_mode & 0o077 == 0


def test_the_provisioners_own_credential_never_reaches_a_machine(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tls.files("provisioner", "dep")
    monkeypatch.setenv("GPUFLEET_TLS_CERT_FILE", str(mine.cert))
    monkeypatch.setenv("GPUFLEET_TLS_KEY_FILE", str(mine.key))
    monkeypatch.setenv("GPUFLEET_TLS_MACHINE_CA_KEY_FILE", str(mine.key))
    driver = local_driver(root, "dep", agent="serve")
    create(driver, "m-1")
    env = agent_env(root, "m-1")
    assert env["GPUFLEET_TLS_CERT_FILE"] != str(mine.cert)
    assert env["GPUFLEET_TLS_KEY_FILE"] != str(mine.key)
    assert "GPUFLEET_TLS_MACHINE_CA_KEY_FILE" not in env


def test_clock_settings_travel_to_agents_and_the_port_file_does_not(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_PORT_FILE", "/tmp/provisioner.port")
    monkeypatch.setenv("GPUFLEET_CLOCK_SPEED", "60")
    driver = local_driver(root, "dep", agent="serve")
    create(driver, "m-1")
    env = agent_env(root, "m-1")
    assert "GPUFLEET_PORT_FILE" not in env
    assert env["GPUFLEET_CLOCK_SPEED"] == "60"


def free_port_pair() -> int:
    """A port p with p and p + 1 both free, below the kernel's ephemeral range so that
    other tests' client sockets do not take p + 1 meanwhile."""
    import random

    for _ in range(100):
        base = random.randint(20_000, 30_000)
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
            return base
    raise RuntimeError("no free pair of ports")


def test_a_base_port_gives_machine_n_port_base_plus_n(root: Path) -> None:
    base = free_port_pair()
    driver = local_driver(root, "dep", agent="serve", base_port=base)
    first, second = create(driver, "m-a"), create(driver, "m-b")
    assert (first.agent_address, second.agent_address) == (f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}")
    driver.destroy(ref("m-a"))
    assert create(driver, "m-c").agent_address == f"127.0.0.1:{base}"  # the freed index is reused


def test_stop_ends_agent_and_worker_and_keeps_the_disk(root: Path) -> None:
    driver = local_driver(root, "dep")
    create(driver, "m-1")
    disk = root / "m-1" / "disk"
    agent_pid, worker_pid = read_int(disk / "agent.pid"), read_int(disk / "worker.pid")
    (disk / "checkpoint.bin").write_bytes(b"state")

    stopped = driver.stop(ref("m-1"))
    assert stopped.status is InstanceStatus.STOPPED
    assert stopped.agent_address == ""
    assert not pid_alive(agent_pid)
    assert not pid_alive(worker_pid)
    assert (disk / "checkpoint.bin").read_bytes() == b"state"

    started = driver.start(ref("m-1"))
    assert started.status is InstanceStatus.RUNNING
    assert probe_machine_id("m-1", started.agent_address) == "m-1"
    assert read_int(disk / "agent.pid") != agent_pid
    assert (disk / "checkpoint.bin").read_bytes() == b"state"


def test_stop_kills_what_ignores_sigterm(root: Path) -> None:
    driver = local_driver(root, "dep", agent="ignore-term", stop_grace_s=0.3)
    create(driver, "m-1")
    disk = root / "m-1" / "disk"
    pids = [read_int(disk / "agent.pid"), read_int(disk / "worker.pid")]
    assert driver.stop(ref("m-1")).status is InstanceStatus.STOPPED
    assert not any(pid_alive(p) for p in pids)


def test_destroy_ends_every_process_and_removes_the_folder(root: Path) -> None:
    driver = local_driver(root, "dep")
    create(driver, "m-1")
    disk = root / "m-1" / "disk"
    pids = [read_int(disk / "agent.pid"), read_int(disk / "worker.pid")]
    names = driver.host_names(0)
    assert driver.destroy(ref("m-1")) is True
    assert not (root / "m-1").exists()
    assert not any(pid_alive(p) for p in pids)
    # What the machine took on the host is given back with it.
    assert not [u.pw_name for u in pwd.getpwall() if u.pw_name.startswith(names.slot_user_prefix)]
    assert not names.walls_root.exists()


def test_machine_n_of_two_stacks_takes_names_of_its_own_on_the_host(tmp_path: Path) -> None:
    """Two stacks (two local roots) each run their machine 0 here: each has its own slot users
    and walls, so neither's wipe before and after a job can reach the other's jobs."""
    roots = [tmp_path / "stack-a" / "machines", tmp_path / "stack-b" / "machines"]
    try:
        drivers = [local_driver(r, "local") for r in roots]
        for driver in drivers:
            create(driver, "m-1")  # the same machine id in both, and machine number 0 in both
        envs = [agent_env(r, "m-1") for r in roots]
        names = [d.host_names(0) for d in drivers]
        assert [e["GPUFLEET_WALLS_NAME"] for e in envs] == [n.walls_name for n in names]
        assert names[0].walls_name != names[1].walls_name
        for n in names:  # the agents made them: three slots each
            assert [pwd.getpwnam(n.slot_user(slot)).pw_dir for slot in range(3)] == [
                str(n.walls_root / "homes" / str(slot)) for slot in range(3)
            ]
    finally:
        for r in roots:
            kill_local_machines(r)
    for n in names:
        assert not [u for u in pwd.getpwall() if u.pw_name.startswith(n.slot_user_prefix)]


def test_host_wide_names_of_the_provisioners_own_never_reach_a_machine(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_SLOT_USER_PREFIX", "gpufleet-slot-")
    monkeypatch.setenv("GPUFLEET_WALLS_ROOT", "/var/lib/gpufleet/walls/shared")
    monkeypatch.setenv("GPUFLEET_WALLS_NAME", "shared")
    driver = local_driver(root, "dep", agent="serve")
    create(driver, "m-1")
    env = agent_env(root, "m-1")
    assert "GPUFLEET_SLOT_USER_PREFIX" not in env
    assert "GPUFLEET_WALLS_ROOT" not in env
    assert env["GPUFLEET_WALLS_NAME"] == driver.host_names(0).walls_name


def test_a_stop_says_the_platform_ends_the_machines_jobs_and_a_start_unsays_it(root: Path) -> None:
    driver = local_driver(root, "dep", agent="serve")
    create(driver, "m-1")
    marker = root / "m-1" / "disk" / "machine.stopping"
    driver.stop(ref("m-1"))
    assert "stopped by the provisioner" in marker.read_text()
    driver.start(ref("m-1"))
    assert not marker.exists()


def test_a_hung_boot_is_running_without_an_agent_address(root: Path) -> None:
    driver = local_driver(root, "dep", agent="hang", agent_wait_s=0.5)
    info = create(driver, "m-1")
    assert info.status is InstanceStatus.RUNNING
    assert info.agent_address == ""
    assert driver.get(ref("m-1")).status is InstanceStatus.RUNNING


def test_a_machine_whose_processes_died_is_stopped(root: Path) -> None:
    driver = local_driver(root, "dep", agent="serve")
    create(driver, "m-1")
    record = json.loads((root / "m-1" / "instance.json").read_text())
    kill_group(record["pgid"])
    pause = threading.Event()
    for _ in range(100):
        if driver.get(ref("m-1")).status is InstanceStatus.STOPPED:
            break
        pause.wait(0.05)
    info = driver.get(ref("m-1"))
    assert (info.status, info.agent_address, info.stopped_by_itself) == (InstanceStatus.STOPPED, "", False)
    assert driver.start(ref("m-1")).status is InstanceStatus.RUNNING


def test_a_machine_that_stopped_itself_says_so_and_is_cleared_by_a_start(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its agent's dead-man switch (idle, nobody calling) ends the machine's session; the
    driver reports it stopped *by itself*, so the sweeper does not take it for a pre-emption."""
    monkeypatch.setenv("GPUFLEET_DEAD_MAN_AFTER_S", "2")
    monkeypatch.setenv("GPUFLEET_DEAD_MAN_EVERY_S", "0.1")
    driver = local_driver(root, "dep")
    create(driver, "m-1")
    assert agent_env(root, "m-1")["GPUFLEET_DEAD_MAN_ACTION"] == "session"
    pause = threading.Event()
    for _ in range(600):
        if driver.get(ref("m-1")).status is InstanceStatus.STOPPED:
            break
        pause.wait(0.05)
    info = driver.get(ref("m-1"))
    assert (info.status, info.stopped_by_itself) == (InstanceStatus.STOPPED, True)
    started = driver.start(ref("m-1"))
    assert started.status is InstanceStatus.RUNNING and not started.stopped_by_itself
    assert not (root / "m-1" / "disk" / "stopped_by_itself").exists()


def test_a_new_driver_on_the_same_host_sees_and_controls_what_exists(root: Path) -> None:
    before = local_driver(root, "dep")
    first = create(before, "m-1")
    worker_pid = read_int(root / "m-1" / "disk" / "worker.pid")
    del before  # the provisioner restarted: its memory is gone, the machine is not

    after = local_driver(root, "dep")
    [seen] = after.list()
    assert (seen.provider_instance_id, seen.status) == (first.provider_instance_id, InstanceStatus.RUNNING)
    assert probe_machine_id("m-1", seen.agent_address) == "m-1"
    adopted = after.create(InstanceSpec(machine_id="m-1", offering=OFFERING))
    assert adopted.provider_instance_id == first.provider_instance_id
    assert after.stop(ref("m-1")).status is InstanceStatus.STOPPED
    assert not pid_alive(worker_pid)


def test_a_machine_id_that_would_leave_the_root_is_refused(root: Path) -> None:
    driver = local_driver(root, "dep", agent="serve")
    with pytest.raises(InvalidArgument):
        create(driver, "../escape")
    assert driver.destroy(ref("../escape")) is False
    assert not (root.parent / "escape").exists()
