"""``python -m gpufleet.provisioner`` as a real process, called through ProvisionerClient:
typed errors arrive typed, bad input names its field, and restarting the provisioner ends
no machine (local machines run the real ``python -m gpufleet.agent``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpufleet.common.clients.agent import AgentClient
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.errors import FailedPrecondition, InvalidArgument
from gpufleet.common.provider_errors import InstanceNotFound, InsufficientCapacity
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import machine_pb2, provisioner_service_pb2, provisioner_service_pb2_grpc
from tests.integration.provisioner.conftest import kill_local_machines, pid_alive
from tests.support import tls

SIM = machine_pb2.Offering(
    provider=machine_pb2.PROVIDER_SIM, region="sim-1", zone="sim-1a", instance_type="g2-standard-8", slots=2
)
SIM_OUT = machine_pb2.Offering(
    provider=machine_pb2.PROVIDER_SIM,
    region="sim-1",
    zone="sim-1-out",
    instance_type="g2-standard-8",
    slots=2,
)
LOCAL = machine_pb2.Offering(
    provider=machine_pb2.PROVIDER_LOCAL,
    region="local",
    zone="local-a",
    instance_type="local-g2-standard-8",
    slots=2,
)


DEPLOYMENT = "proc-test"


class Provisioner:
    """One provisioner process; ``restart`` stops it with SIGTERM and starts a fresh one."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self) -> None:
        port_file = self.tmp / "provisioner.port"
        port_file.unlink(missing_ok=True)
        log = (self.tmp / "provisioner.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.provisioner"],
            env={**self.env, "GPUFLEET_PORT_FILE": str(port_file)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        pause = threading.Event()
        for _ in range(300):
            if port_file.exists():
                self.address = f"127.0.0.1:{port_file.read_text().strip()}"
                return
            assert self.proc.poll() is None, (self.tmp / "provisioner.log").read_text()
            pause.wait(0.05)
        raise AssertionError("provisioner never announced its port")

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=20)

    def client(self) -> ProvisionerClient:
        return ProvisionerClient(self.address, tls.transport("scheduler", DEPLOYMENT), timeout_s=30)


@pytest.fixture
def provisioner(tmp_path: Path) -> Iterator[Provisioner]:
    root = tmp_path / "machines"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.update(
        {
            "GPUFLEET_LISTEN_ADDRESS": "127.0.0.1:0",
            **tls.env("provisioner", DEPLOYMENT),
            "GPUFLEET_DRIVERS": "sim,local",
            "GPUFLEET_LOCAL_ROOT": str(root),
            "GPUFLEET_LOCAL_AGENT_BASE_PORT": "0",
            "GPUFLEET_SIM_STOCKOUT_ZONES": "sim-1-out",
            "GPUFLEET_LOG_FORMAT": "text",
        }
    )
    p = Provisioner(tmp_path, env)
    p.start()
    yield p
    if p.proc is not None and p.proc.poll() is None:
        p.stop()
    kill_local_machines(root)


def ask_agent(machine_id: str, address: str) -> str:
    """The machine id the real agent at ``address`` answers Probe with, dialled as the
    machine ``machine_id`` (only that machine's certificate is accepted)."""
    with AgentClient(machine_id, address, tls.transport("scheduler", DEPLOYMENT)) as client:
        return client.probe().machine_id


def test_a_stockout_arrives_as_insufficient_capacity(provisioner: Provisioner) -> None:
    client = provisioner.client()
    with pytest.raises(InsufficientCapacity):
        client.create("m-out", SIM_OUT, request_id="r-1")
    made = client.create("m-in", SIM, request_id="r-2")
    assert made.status in (
        provisioner_service_pb2.INSTANCE_STATUS_PENDING,
        provisioner_service_pb2.INSTANCE_STATUS_RUNNING,
    )
    assert client.create("m-in", SIM, request_id="r-3").provider_instance_id == made.provider_instance_id
    instances, unreachable = client.list_all()
    assert ([i.machine_id for i in instances], unreachable) == (["m-in"], [])
    assert client.destroy("m-in", SIM, made.provider_instance_id, request_id="r-4") is True
    assert client.destroy("m-in", SIM, made.provider_instance_id, request_id="r-5") is False
    with pytest.raises(InstanceNotFound):
        client.get("m-in", SIM, made.provider_instance_id)
    client.close()


def test_bad_input_is_invalid_argument_naming_the_field(provisioner: Provisioner) -> None:
    client = provisioner.client()
    with pytest.raises(InvalidArgument) as missing_id:
        client.create("", SIM, request_id="r-1")
    assert missing_id.value.field == "machine_id"
    assert missing_id.value.grpc_code is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument) as no_zone:
        client.create(
            "m-1",
            machine_pb2.Offering(provider=machine_pb2.PROVIDER_SIM, instance_type="t", slots=1),
            request_id="r-2",
        )
    assert no_zone.value.field == "offering.zone"
    with pytest.raises(FailedPrecondition):
        client.create(
            "m-1",
            machine_pb2.Offering(
                provider=machine_pb2.PROVIDER_AWS, zone="us-east-1a", instance_type="g6.xlarge", slots=1
            ),
            request_id="r-3",
        )
    client.close()


def test_health_and_list_offerings_of_the_default_catalogue(provisioner: Provisioner) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with tls.channel(
        provisioner.address, Role.PROVISIONER, who="scheduler", deployment=DEPLOYMENT
    ) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="gpufleet.v1.ProvisionerService"), timeout=10
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        offerings = (
            provisioner_service_pb2_grpc.ProvisionerServiceStub(channel)
            .ListOfferings(provisioner_service_pb2.ListOfferingsRequest(), timeout=10)
            .offerings
        )
    assert [(o.offering_id, o.provider) for o in offerings] == [("local-l4", machine_pb2.PROVIDER_LOCAL)]


def test_restarting_the_provisioner_ends_no_local_machine(provisioner: Provisioner) -> None:
    client = provisioner.client()
    made = client.create("m-local", LOCAL, request_id="r-1")
    assert made.status == provisioner_service_pb2.INSTANCE_STATUS_RUNNING
    assert ask_agent("m-local", made.agent_address) == "m-local"
    client.close()

    assert provisioner.stop() == 0
    assert ask_agent("m-local", made.agent_address) == "m-local"  # the machine outlived its provisioner

    provisioner.start()
    client = provisioner.client()
    instances, _ = client.list_all()
    assert [(i.provider_instance_id, i.status, i.agent_address) for i in instances] == [
        (made.provider_instance_id, provisioner_service_pb2.INSTANCE_STATUS_RUNNING, made.agent_address)
    ]
    disk = provisioner.tmp / "machines" / "m-local" / "disk"
    worker_pid = int((disk / "worker.pid").read_text())
    assert client.destroy("m-local", LOCAL, made.provider_instance_id, request_id="r-2") is True
    assert not pid_alive(worker_pid)
    assert client.list_all() == ([], [])
    client.close()
