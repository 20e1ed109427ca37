"""The real ProvisionerService with its ``sim`` driver, served on 127.0.0.1 port 0.

Used where a test wants the provisioner's own behaviour (its validation, its typed error
trailer, the sim cloud's instance states) rather than a script: the SimCloud records
every call and takes injected errors, and shares the test's manual clock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpufleet.common.catalog import Catalog, load_catalog
from gpufleet.common.clock import Clock
from gpufleet.common.grpcserver import ServiceBinding, ServiceServer, create_server
from gpufleet.provisioner.drivers.base import InstanceInfo, InstanceSpec, Offering, Provider
from gpufleet.provisioner.drivers.sim import SimCloud, SimDriver
from gpufleet.provisioner.service import ProvisionerService
from gpufleet.v1 import provisioner_service_pb2, provisioner_service_pb2_grpc
from tests.support import tls

DEPLOYMENT = "test"
SIM_OFFERING = Offering(provider=Provider.SIM, region="sim-1", zone="sim-1a", instance_type="sim.l4", slots=2)


@dataclass
class SimProvisioner:
    cloud: SimCloud
    server: ServiceServer

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def create(self, machine_id: str) -> InstanceInfo:
        """An instance in the sim cloud for ``machine_id``, as a CreateInstance would leave it."""
        return self.cloud.driver(DEPLOYMENT).create(
            InstanceSpec(machine_id=machine_id, offering=SIM_OFFERING)
        )

    def instance(self, machine_id: str) -> InstanceInfo | None:
        found = [i for i in self.cloud.all_instances() if i.machine_id == machine_id]
        return found[0] if found else None


@contextmanager
def serve_sim_provisioner(
    clock: Clock, catalog: Catalog | None = None, deployment: str = DEPLOYMENT
) -> Iterator[SimProvisioner]:
    """The provisioner serving ``catalog`` (the embedded one by default) from a sim cloud
    account, for ``deployment``'s instances."""
    cloud = SimCloud(clock)
    servicer = ProvisionerService(
        {Provider.SIM: cloud.driver(deployment)}, catalog if catalog is not None else load_catalog(None)
    )
    server = create_server(
        "127.0.0.1:0",
        [
            ServiceBinding(
                provisioner_service_pb2_grpc.add_ProvisionerServiceServicer_to_server,
                servicer,
                provisioner_service_pb2.DESCRIPTOR.services_by_name["ProvisionerService"].full_name,
            )
        ],
        max_workers=4,
        transport=tls.transport("provisioner"),
    )
    try:
        yield SimProvisioner(cloud, server)
    finally:
        server.stop(0)


class SlowCreates(SimDriver):
    """The sim driver whose create takes as long as a busy cloud's insert: once armed
    (``create_s``), each create waits that long in real time — or until ``release()`` —
    before it reaches the cloud, as GCE's insert operation does before it is done. The
    cloud itself stays the SimCloud: idempotent by machine id, so two creates of one
    machine (a leader change) leave one instance."""

    def __init__(self, cloud: SimCloud, deployment_id: str) -> None:
        super().__init__(cloud, deployment_id)
        self.create_s = 0.0
        self._released = threading.Event()
        self.waiting = 0
        self._lock = threading.Lock()

    def create(self, spec: InstanceSpec) -> InstanceInfo:
        if self.create_s:
            with self._lock:
                self.waiting += 1
            try:
                self._released.wait(self.create_s)
            finally:
                with self._lock:
                    self.waiting -= 1
        return super().create(spec)

    def release(self) -> None:
        self._released.set()


@contextmanager
def serve_provisioner(driver: SimDriver, catalog: Catalog | None = None) -> Iterator[ServiceServer]:
    """The real ProvisionerService over gRPC on 127.0.0.1 with this one sim driver."""
    server = create_server(
        "127.0.0.1:0",
        [
            ServiceBinding(
                provisioner_service_pb2_grpc.add_ProvisionerServiceServicer_to_server,
                ProvisionerService({Provider.SIM: driver}, catalog or load_catalog(None)),
                provisioner_service_pb2.DESCRIPTOR.services_by_name["ProvisionerService"].full_name,
            )
        ],
        max_workers=32,
        transport=tls.transport("provisioner"),
    )
    try:
        yield server
    finally:
        server.stop(0)
