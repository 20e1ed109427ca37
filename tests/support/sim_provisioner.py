"""The real ProvisionerService with its ``sim`` driver, served on 127.0.0.1 port 0.

Used where a test wants the provisioner's own behaviour (its validation, its typed error
trailer, the sim cloud's instance states) rather than a script: the SimCloud records
every call and takes injected errors, and shares the test's manual clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpufleet.common.catalog import load_catalog
from gpufleet.common.clock import Clock
from gpufleet.common.grpcserver import ServiceBinding, ServiceServer, create_server
from gpufleet.provisioner.drivers.base import InstanceInfo, InstanceSpec, Offering, Provider
from gpufleet.provisioner.drivers.sim import SimCloud
from gpufleet.provisioner.service import ProvisionerService
from gpufleet.v1 import provisioner_service_pb2, provisioner_service_pb2_grpc

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
def serve_sim_provisioner(clock: Clock) -> Iterator[SimProvisioner]:
    cloud = SimCloud(clock)
    servicer = ProvisionerService({Provider.SIM: cloud.driver(DEPLOYMENT)}, load_catalog(None))
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
    )
    try:
        yield SimProvisioner(cloud, server)
    finally:
        server.stop(0)
