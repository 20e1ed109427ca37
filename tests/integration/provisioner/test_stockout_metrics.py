"""Stockouts as an operator reads them: CreateInstance over real gRPC on loopback to the
real ProvisionerService, its sim cloud out of capacity in one zone. Each refused create is
counted once by provider, the catalogue offering's region and the offering — beside the
provider-calls counter's INSUFFICIENT_CAPACITY, which says how many but not where."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.common.catalog import DEFAULT_CATALOG, Catalog, OfferingSpec, PoolSpec
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.grpcserver import ServiceBinding, create_server
from gpufleet.common.metrics.catalog import PROVIDER_CALLS, PROVIDER_STOCKOUTS
from gpufleet.common.provider_errors import InsufficientCapacity
from gpufleet.provisioner.drivers.base import Provider
from gpufleet.provisioner.drivers.instrumented import InstrumentedDriver
from gpufleet.provisioner.drivers.sim import SimCloud
from gpufleet.provisioner.service import ProvisionerService
from gpufleet.v1 import machine_pb2, provisioner_service_pb2, provisioner_service_pb2_grpc
from tests.support import tls
from tests.support.metrics import MetricsProbe

SIM_L4 = OfferingSpec(
    id="sim-l4",
    provider="SIM",
    region="sim-1",
    zone="sim-1a",
    instance_type="sim.l4",
    slots=2,
    hourly_price_micros=300_000,
)
SIM_L4_B = SIM_L4.model_copy(update={"id": "sim-l4-b", "zone": "sim-1b"})
CATALOG = Catalog(
    plans=DEFAULT_CATALOG.plans,
    workspaces=DEFAULT_CATALOG.workspaces,
    kinds=DEFAULT_CATALOG.kinds,
    pools=[PoolSpec(id="l4", slots_per_machine=2, offerings=[SIM_L4, SIM_L4_B])],
)


def wire(spec: OfferingSpec, **replaced: str) -> machine_pb2.Offering:
    """The offering as the scheduler sends it (from its catalogue), fields replaced."""
    fields = dict(
        offering_id=spec.id,
        provider=machine_pb2.PROVIDER_SIM,
        region=spec.region,
        zone=spec.zone,
        instance_type=spec.instance_type,
        slots=spec.slots,
    )
    fields.update(replaced)
    return machine_pb2.Offering(**fields)


class Served:
    def __init__(self) -> None:
        self.probe = MetricsProbe()
        self.cloud = SimCloud(ManualClock())
        driver = InstrumentedDriver(self.cloud.driver("dep"), self.probe.instruments)
        servicer = ProvisionerService({Provider.SIM: driver}, CATALOG, self.probe.instruments)
        self.server = create_server(
            "127.0.0.1:0",
            [
                ServiceBinding(
                    provisioner_service_pb2_grpc.add_ProvisionerServiceServicer_to_server,
                    servicer,
                    provisioner_service_pb2.DESCRIPTOR.services_by_name["ProvisionerService"].full_name,
                )
            ],
            transport=tls.transport("provisioner"),
        )
        self.client = ProvisionerClient(
            f"127.0.0.1:{self.server.port}", tls.transport("scheduler"), timeout_s=10
        )

    def stockouts(self) -> dict[tuple[str, str, str], float]:
        return {
            (d["provider"], d["region"], d["offering"]): value
            for labels, value in self.probe.series(PROVIDER_STOCKOUTS.name).items()
            for d in [dict(labels)]
        }

    def close(self) -> None:
        self.client.close()
        self.server.stop(0)
        self.probe.close()


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


def test_each_refused_create_is_one_stockout_of_its_catalogue_offering(served: Served) -> None:
    served.cloud.set_stockout("sim-1a")
    for n in range(3):
        with pytest.raises(InsufficientCapacity):
            served.client.create(f"m-{n}", wire(SIM_L4), request_id=f"create-m-{n}")
    served.client.create("m-b", wire(SIM_L4_B), request_id="create-m-b")  # the other zone creates

    assert served.stockouts() == {("SIM", "sim-1", "sim-l4"): 3}
    calls = served.probe.series(PROVIDER_CALLS.name)
    refused = (("operation", "create"), ("provider", "SIM"), ("result", "INSUFFICIENT_CAPACITY"))
    assert calls[refused] == 3  # the same creates the calls counter saw refused

    served.cloud.set_stockout("sim-1a", out=False)
    served.client.create("m-0", wire(SIM_L4), request_id="create-m-0-again")
    assert served.stockouts() == {("SIM", "sim-1", "sim-l4"): 3}  # a create that went through adds none


def test_a_create_of_an_offering_the_catalogue_does_not_hold_is_counted_unlisted(served: Served) -> None:
    served.cloud.set_stockout("sim-1a")
    with pytest.raises(InsufficientCapacity):
        served.client.create("m-1", wire(SIM_L4, offering_id="hand-made", region="sim-9"), request_id="c-1")
    with pytest.raises(InsufficientCapacity):
        served.client.create("m-2", wire(SIM_L4, offering_id="renamed"), request_id="c-2")
    assert served.stockouts() == {("SIM", "unlisted", "unlisted"): 1, ("SIM", "sim-1", "unlisted"): 1}
