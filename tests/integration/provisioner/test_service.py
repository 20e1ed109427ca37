"""ProvisionerService over real gRPC on loopback (in-process server): routing, validation,
typed errors, ListInstances paging and unreachable providers, ListOfferings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpufleet.common import grpcclient
from gpufleet.common.catalog import DEFAULT_CATALOG, Catalog, OfferingSpec, PoolSpec
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.errors import FIELD_METADATA_KEY
from gpufleet.common.grpcserver import ServiceBinding, ServiceServer, create_server
from gpufleet.common.provider_errors import (
    METADATA_KEY,
    AuthFailed,
    InstanceNotFound,
    InsufficientCapacity,
    NotYetDone,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from gpufleet.common.rich_status import details_of
from gpufleet.common.trust.identity import Role
from gpufleet.provisioner.drivers.base import Provider
from gpufleet.provisioner.drivers.sim import SimCloud
from gpufleet.provisioner.service import ProvisionerService
from gpufleet.v1 import machine_pb2, provisioner_service_pb2, provisioner_service_pb2_grpc
from tests.integration.provisioner.conftest import kill_local_machines, local_driver
from tests.support import tls

pb = provisioner_service_pb2

SIM_OFFERING = machine_pb2.Offering(
    provider=machine_pb2.PROVIDER_SIM, region="sim-1", zone="sim-1a", instance_type="g2-standard-8", slots=2
)
LOCAL_OFFERING = machine_pb2.Offering(
    provider=machine_pb2.PROVIDER_LOCAL, region="local", zone="local-a", instance_type="local", slots=1
)

CATALOG = Catalog(
    plans=DEFAULT_CATALOG.plans,
    workspaces=DEFAULT_CATALOG.workspaces,
    kinds=DEFAULT_CATALOG.kinds,
    pools=[
        PoolSpec(
            id="l4",
            slots_per_machine=2,
            offerings=[
                OfferingSpec(
                    id="gcp-l4",
                    provider="GCP",
                    region="us-central1",
                    zone="us-central1-a",
                    instance_type="g2-standard-8",
                    slots=2,
                    hourly_price_micros=700_000,
                ),
                OfferingSpec(
                    id="sim-l4",
                    provider="SIM",
                    region="sim-1",
                    zone="sim-1a",
                    instance_type="g2-standard-8",
                    slots=2,
                    capacity_type="SPOT",
                    hourly_price_micros=300_000,
                ),
                OfferingSpec(
                    id="local-l4",
                    provider="LOCAL",
                    region="local",
                    zone="local-a",
                    instance_type="local",
                    slots=2,
                    hourly_price_micros=850_000,
                ),
            ],
        ),
        PoolSpec(
            id="a100",
            gpu_model="A100",
            slots_per_machine=1,
            offerings=[
                OfferingSpec(
                    id="sim-a100",
                    provider="SIM",
                    region="sim-1",
                    zone="sim-1b",
                    gpu_model="A100",
                    instance_type="a2-highgpu-1g",
                    slots=1,
                    hourly_price_micros=3_000_000,
                ),
            ],
        ),
    ],
)


class Served:
    def __init__(self, server: ServiceServer, cloud: SimCloud) -> None:
        self.server, self.cloud = server, cloud
        self.address = f"127.0.0.1:{server.port}"
        self.channel = tls.channel(self.address, Role.PROVISIONER, who="scheduler")
        self.stub = provisioner_service_pb2_grpc.ProvisionerServiceStub(self.channel)
        self.client = ProvisionerClient(self.address, tls.transport("scheduler"), timeout_s=10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    cloud = SimCloud(ManualClock())
    root = tmp_path / "machines"
    drivers = {Provider.SIM: cloud.driver("dep"), Provider.LOCAL: local_driver(root, "dep", agent="serve")}
    server = create_server(
        "127.0.0.1:0",
        [
            ServiceBinding(
                provisioner_service_pb2_grpc.add_ProvisionerServiceServicer_to_server,
                ProvisionerService(drivers, CATALOG),
                pb.DESCRIPTOR.services_by_name["ProvisionerService"].full_name,
            )
        ],
        transport=tls.transport("provisioner"),
    )
    s = Served(server, cloud)
    yield s
    s.client.close()
    s.channel.close()
    server.stop(0)
    kill_local_machines(root)


def rpc_error(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value


def _with(**fields: object) -> machine_pb2.Offering:
    """SIM_OFFERING with some fields replaced."""
    offering = machine_pb2.Offering()
    offering.CopyFrom(SIM_OFFERING)
    for name, value in fields.items():
        setattr(offering, name, value)
    return offering


INVALID = [
    ("CreateInstance", pb.CreateInstanceRequest(offering=SIM_OFFERING), "machine_id"),
    ("CreateInstance", pb.CreateInstanceRequest(machine_id="Bad/../Id", offering=SIM_OFFERING), "machine_id"),
    ("CreateInstance", pb.CreateInstanceRequest(machine_id="m-1"), "offering"),
    (
        "CreateInstance",
        pb.CreateInstanceRequest(
            machine_id="m-1", offering=machine_pb2.Offering(zone="z", instance_type="t", slots=1)
        ),
        "offering.provider",
    ),
    (
        "CreateInstance",
        pb.CreateInstanceRequest(
            machine_id="m-1",
            offering=machine_pb2.Offering(provider=machine_pb2.PROVIDER_SIM, instance_type="t", slots=1),
        ),
        "offering.zone",
    ),
    (
        "CreateInstance",
        pb.CreateInstanceRequest(
            machine_id="m-1",
            offering=machine_pb2.Offering(provider=machine_pb2.PROVIDER_SIM, zone="z", slots=1),
        ),
        "offering.instance_type",
    ),
    (
        "CreateInstance",
        pb.CreateInstanceRequest(
            machine_id="m-1",
            offering=machine_pb2.Offering(provider=machine_pb2.PROVIDER_SIM, zone="z", instance_type="t"),
        ),
        "offering.slots",
    ),
    *[
        ("CreateInstance", pb.CreateInstanceRequest(machine_id="m-1", offering=bad), field)
        for bad, field in [
            (_with(zone="us-east1-b; rm -rf /"), "offering.zone"),
            (_with(region="r\u00e9gion"), "offering.region"),
            (_with(instance_type="../../etc"), "offering.instance_type"),
            (_with(hourly_price_micros=-1), "offering.hourly_price_micros"),
            (_with(capacity_type=99), "offering.capacity_type"),
            (_with(slots=10_000), "offering.slots"),
            (_with(gpu_count=-2), "offering.gpu_count"),
        ]
    ],
    ("StartInstance", pb.StartInstanceRequest(offering=SIM_OFFERING), "machine_id"),
    ("StopInstance", pb.StopInstanceRequest(machine_id="m-1"), "offering"),
    (
        "DestroyInstance",
        pb.DestroyInstanceRequest(machine_id="m-1", offering=SIM_OFFERING, provider_instance_id="; rm -rf /"),
        "provider_instance_id",
    ),
    ("GetInstance", pb.GetInstanceRequest(machine_id="", offering=SIM_OFFERING), "machine_id"),
    ("ListInstances", pb.ListInstancesRequest(page_token="not-a-token"), "page_token"),
    ("ListInstances", pb.ListInstancesRequest(page_size=-1), "page_size"),
    ("ListOfferings", pb.ListOfferingsRequest(page_token="bm9wZQ"), "page_token"),
]


@pytest.mark.parametrize(("method", "request_msg", "field"), INVALID, ids=[f"{m}-{f}" for m, _, f in INVALID])
def test_bad_input_is_invalid_argument_naming_the_field(
    served: Served, method: str, request_msg: object, field: str
) -> None:
    err = rpc_error(lambda: getattr(served.stub, method)(request_msg, timeout=10))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert grpcclient.metadata_value(err, FIELD_METADATA_KEY) == field
    assert served.cloud.calls == []  # nothing reached a provider


def test_a_request_wrong_in_several_fields_names_each_one(served: Served) -> None:
    create = pb.CreateInstanceRequest(
        machine_id="M 1",
        offering=machine_pb2.Offering(
            provider=machine_pb2.PROVIDER_SIM, zone="us-east1-b; rm -rf /", slots=0, hourly_price_micros=-1
        ),
    )
    err = rpc_error(lambda: served.stub.CreateInstance(create, timeout=10))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert [(v.field, v.reason) for v in details_of(err).violations] == [
        ("machine_id", "INVALID_FORMAT"),
        ("offering.instance_type", "REQUIRED"),
        ("offering.slots", "OUT_OF_RANGE"),
        ("offering.zone", "INVALID_FORMAT"),
        ("offering.hourly_price_micros", "OUT_OF_RANGE"),
    ]
    destroy = pb.DestroyInstanceRequest(machine_id="", provider_instance_id="; rm -rf /")
    err = rpc_error(lambda: served.stub.DestroyInstance(destroy, timeout=10))
    assert [v.field for v in details_of(err).violations] == ["machine_id", "offering", "provider_instance_id"]
    assert served.cloud.calls == []  # nothing reached a provider


def test_a_provider_not_configured_is_failed_precondition(served: Served) -> None:
    gcp = machine_pb2.Offering(
        provider=machine_pb2.PROVIDER_GCP, zone="us-central1-a", instance_type="g2-standard-8", slots=2
    )
    err = rpc_error(
        lambda: served.stub.CreateInstance(
            pb.CreateInstanceRequest(machine_id="m-1", offering=gcp), timeout=10
        )
    )
    assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "GCP" in (err.details() or "")
    err = rpc_error(
        lambda: served.stub.ListInstances(
            pb.ListInstancesRequest(provider=machine_pb2.PROVIDER_AWS), timeout=10
        )
    )
    assert err.code() is grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize(
    "error",
    [InstanceNotFound, InsufficientCapacity, QuotaExceeded, AuthFailed, Transient, NotYetDone],
    ids=lambda e: e.kind,
)
def test_provider_errors_arrive_typed_with_code_and_trailer(
    served: Served, error: type[ProviderError]
) -> None:
    served.cloud.fail_next("create", error("injected"), times=2)
    err = rpc_error(
        lambda: served.stub.CreateInstance(
            pb.CreateInstanceRequest(machine_id="m-1", offering=SIM_OFFERING), timeout=10
        )
    )
    assert err.code() is error.code
    assert grpcclient.metadata_value(err, METADATA_KEY) == error.kind
    with pytest.raises(error):
        served.client.create("m-1", SIM_OFFERING, request_id="r-1")


def test_calls_route_by_the_offerings_provider(served: Served) -> None:
    sim = served.client.create("m-sim", SIM_OFFERING, request_id="r-1")
    local = served.client.create("m-local", LOCAL_OFFERING, request_id="r-2")
    assert (sim.provider, sim.name) == (machine_pb2.PROVIDER_SIM, f"instances/sim/{sim.provider_instance_id}")
    assert local.provider == machine_pb2.PROVIDER_LOCAL
    assert local.status == pb.INSTANCE_STATUS_RUNNING and local.agent_address
    assert [c.machine_id for c in served.cloud.calls_of("create")] == ["m-sim"]
    assert served.client.destroy("m-local", LOCAL_OFFERING, local.provider_instance_id, "r-3") is True
    assert served.client.destroy("m-local", LOCAL_OFFERING, local.provider_instance_id, "r-4") is False


def test_list_instances_pages_through_every_instance_once(served: Served) -> None:
    made = {
        served.client.create(f"m-{n}", SIM_OFFERING, request_id=f"r-{n}").provider_instance_id
        for n in range(5)
    }
    seen: list[str] = []
    token, pages = "", 0
    while True:
        resp = served.stub.ListInstances(pb.ListInstancesRequest(page_size=2, page_token=token), timeout=10)
        seen.extend(i.provider_instance_id for i in resp.instances)
        pages += 1
        token = resp.next_page_token
        if not token:
            break
    assert (pages, sorted(seen), len(seen)) == (3, sorted(made), 5)
    instances, unreachable = served.client.list_all()
    assert ({i.provider_instance_id for i in instances}, unreachable) == (made, [])


def test_a_provider_whose_list_fails_is_unreachable_and_the_others_still_list(served: Served) -> None:
    served.client.create("m-sim", SIM_OFFERING, request_id="r-1")
    local = served.client.create("m-local", LOCAL_OFFERING, request_id="r-2")
    served.cloud.fail_next("list", AuthFailed("credentials expired"))
    resp = served.stub.ListInstances(pb.ListInstancesRequest(), timeout=10)
    assert list(resp.unreachable) == [machine_pb2.PROVIDER_SIM]
    assert [i.provider_instance_id for i in resp.instances] == [local.provider_instance_id]
    only_sim = served.stub.ListInstances(
        pb.ListInstancesRequest(provider=machine_pb2.PROVIDER_SIM), timeout=10
    )
    assert [i.machine_id for i in only_sim.instances] == ["m-sim"]


def test_list_offerings_shows_what_this_provisioner_can_buy(served: Served) -> None:
    ids: list[str] = []
    token = ""
    while True:
        resp = served.stub.ListOfferings(pb.ListOfferingsRequest(page_size=1, page_token=token), timeout=10)
        ids.extend(o.offering_id for o in resp.offerings)
        token = resp.next_page_token
        if not token:
            break
    assert ids == ["sim-l4", "local-l4", "sim-a100"]  # no GCP driver here: gcp-l4 is not served
    [a100] = served.stub.ListOfferings(pb.ListOfferingsRequest(pool="a100"), timeout=10).offerings
    assert (a100.name, a100.provider, a100.gpu_model, a100.zone, a100.slots, a100.hourly_price_micros) == (
        "offerings/sim-a100",
        machine_pb2.PROVIDER_SIM,
        "A100",
        "sim-1b",
        1,
        3_000_000,
    )
    spot = served.stub.ListOfferings(pb.ListOfferingsRequest(pool="l4"), timeout=10).offerings[0]
    assert spot.capacity_type == machine_pb2.CAPACITY_TYPE_SPOT
    err = rpc_error(lambda: served.stub.ListOfferings(pb.ListOfferingsRequest(pool="h100"), timeout=10))
    assert err.code() is grpc.StatusCode.NOT_FOUND
