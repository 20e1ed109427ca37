"""The aws driver against moto's EC2 server on loopback: what the contract suite does not
cover — the create guard against a lost answer, spot requests, tags, paging across pages
and regions, the error table — and the provisioner process serving it over gRPC.

Faults moto cannot produce are EC2 answers given by botocore event hooks on the driver's
own clients (tests/support/moto_server.py), so the driver's classification is what types
them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import botocore.session
import pytest
from botocore.credentials import CredentialResolver

from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.errors import FailedPrecondition
from gpufleet.common.provider_errors import (
    AuthFailed,
    InstanceNotFound,
    InsufficientCapacity,
    NotYetDone,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from gpufleet.provisioner.drivers.aws import AwsDriver, AwsOptions
from gpufleet.provisioner.drivers.aws_clients import ClientBounds, Ec2Clients
from gpufleet.provisioner.drivers.aws_errors import EC2_CODES
from gpufleet.provisioner.drivers.base import (
    DEPLOYMENT_LABEL,
    MACHINE_LABEL,
    CapacityType,
    InstanceRef,
    InstanceSpec,
    InstanceStatus,
    Offering,
    Provider,
    idempotency_key,
)
from gpufleet.v1 import machine_pb2, provisioner_service_pb2
from tests.support import tls
from tests.support.moto_server import (
    TEST_REGIONS,
    Ec2Faults,
    ErrorAnswer,
    MotoServer,
    aws_driver_for,
    connection_closed,
    credentials_env,
    read_timeout,
)
from tests.support.procs import ServiceProcess, start_service

DEPLOYMENT = "aws-dep"
US = Offering(
    provider=Provider.AWS,
    region="us-east-1",
    zone="us-east-1a",
    instance_type="g6.xlarge",
    slots=1,
    gpu_model="L4",
)
US_SPOT = Offering(
    provider=Provider.AWS,
    region="us-east-1",
    zone="us-east-1b",
    instance_type="g6.2xlarge",
    slots=2,
    capacity_type=CapacityType.SPOT,
    gpu_model="L4",
)
EU = Offering(
    provider=Provider.AWS,
    region="eu-central-1",
    zone="eu-central-1a",
    instance_type="g6.xlarge",
    slots=1,
    gpu_model="L4",
)


def new_machine_id() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def driver(moto_server: MotoServer, aws_faults: Ec2Faults) -> AwsDriver:
    return aws_driver_for(moto_server, aws_faults, DEPLOYMENT)


def tags_of(raw: dict[str, object]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}  # type: ignore[attr-defined]


def plant(moto: MotoServer, region: str, tags: dict[str, str] | None) -> str:
    """An instance made beside the driver, straight through EC2's API."""
    args: dict[str, object] = {}
    if tags:
        args["TagSpecifications"] = [
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ]
    made = moto.client(region).run_instances(
        ImageId=moto.image(region), InstanceType="g6.xlarge", MinCount=1, MaxCount=1, **args
    )
    return str(made["Instances"][0]["InstanceId"])


# ---- create is guarded by list-and-adopt, not by the token alone ---------------------------


def test_moto_ignores_the_client_token_so_the_tag_guard_is_what_counts(moto_server: MotoServer) -> None:
    # The premise of the guard: this endpoint makes two instances for one token.
    client = moto_server.client("us-east-1")
    token = idempotency_key(new_machine_id(), "create")
    made = [
        client.run_instances(
            ImageId=moto_server.image("us-east-1"),
            InstanceType="g6.xlarge",
            MinCount=1,
            MaxCount=1,
            ClientToken=token,
        )["Instances"][0]["InstanceId"]
        for _ in range(2)
    ]
    assert made[0] != made[1]


@pytest.mark.parametrize(
    ("lost_answer", "first_error"),
    [(connection_closed, Transient), (read_timeout, NotYetDone)],
    ids=["connection-closed", "read-timeout"],
)
def test_a_create_whose_answer_was_lost_is_adopted_on_retry(
    driver: AwsDriver,
    moto_server: MotoServer,
    aws_faults: Ec2Faults,
    lost_answer: object,
    first_error: type[ProviderError],
) -> None:
    machine_id = new_machine_id()
    aws_faults.lose_next_answer("RunInstances", lost_answer())  # type: ignore[operator]
    with pytest.raises(first_error):
        driver.create(InstanceSpec(machine_id=machine_id, offering=US))
    made = moto_server.instances("us-east-1", {MACHINE_LABEL: machine_id})
    assert len(made) == 1  # EC2 did create it; only the answer was lost

    retried = driver.create(InstanceSpec(machine_id=machine_id, offering=US))

    assert retried.provider_instance_id == made[0]["InstanceId"]
    assert len(moto_server.instances("us-east-1", {MACHINE_LABEL: machine_id})) == 1
    runs = aws_faults.calls_of("RunInstances")
    assert len(runs) == 1
    assert runs[0].params["ClientToken"] == idempotency_key(machine_id, "create")
    assert [i.machine_id for i in driver.list()] == [machine_id]


def test_a_create_after_a_lost_answer_also_carries_the_same_token(
    driver: AwsDriver, aws_faults: Ec2Faults
) -> None:
    # A refused first try (nothing made) and the retry send one and the same token.
    machine_id = new_machine_id()
    aws_faults.fail_next(ErrorAnswer("RequestLimitExceeded", 503), "RunInstances")
    with pytest.raises(Transient):
        driver.create(InstanceSpec(machine_id=machine_id, offering=US))
    driver.create(InstanceSpec(machine_id=machine_id, offering=US))
    tokens = {c.params["ClientToken"] for c in aws_faults.calls_of("RunInstances")}
    assert tokens == {idempotency_key(machine_id, "create")}


# ---- what RunInstances is asked -------------------------------------------------------------


def test_a_spot_offering_asks_for_a_persistent_request_that_stops(
    driver: AwsDriver, moto_server: MotoServer, aws_faults: Ec2Faults
) -> None:
    machine_id = new_machine_id()
    made = driver.create(InstanceSpec(machine_id=machine_id, offering=US_SPOT))

    (run,) = aws_faults.calls_of("RunInstances")
    assert run.params["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "persistent", "InstanceInterruptionBehavior": "stop"},
    }
    assert run.params["InstanceType"] == "g6.2xlarge"
    assert run.params["Placement"] == {"AvailabilityZone": "us-east-1b"}
    assert made.capacity_type is CapacityType.SPOT
    (raw,) = moto_server.instances("us-east-1", {MACHINE_LABEL: machine_id})
    assert raw["InstanceLifecycle"] == "spot"

    # Stopped, a spot machine keeps its instance (and disk) and starts again as itself.
    ref = InstanceRef(machine_id=machine_id, offering=US_SPOT, provider_instance_id=made.provider_instance_id)
    driver.stop(ref)
    assert driver.get(ref).status is InstanceStatus.STOPPED
    assert driver.start(ref).provider_instance_id == made.provider_instance_id
    assert driver.get(ref).status is InstanceStatus.RUNNING
    assert driver.get(ref).capacity_type is CapacityType.SPOT


def test_an_on_demand_offering_asks_for_no_market(driver: AwsDriver, aws_faults: Ec2Faults) -> None:
    made = driver.create(InstanceSpec(machine_id=new_machine_id(), offering=US))
    (run,) = aws_faults.calls_of("RunInstances")
    assert "InstanceMarketOptions" not in run.params
    assert made.capacity_type is CapacityType.ON_DEMAND


def test_create_tags_the_instance_and_its_disk_and_uses_the_region_image(
    driver: AwsDriver, moto_server: MotoServer, aws_faults: Ec2Faults
) -> None:
    machine_id = new_machine_id()
    spec = InstanceSpec(
        machine_id=machine_id, offering=EU, labels={"pool": "l4", MACHINE_LABEL: "someone-else"}
    )
    made = driver.create(spec)

    expected = {DEPLOYMENT_LABEL: DEPLOYMENT, MACHINE_LABEL: machine_id, "pool": "l4"}
    (raw,) = moto_server.instances("eu-central-1", {MACHINE_LABEL: machine_id})
    assert tags_of(raw) == expected
    assert dict(made.labels) == expected
    (run,) = aws_faults.calls_of("RunInstances")
    assert run.region == "eu-central-1"
    assert run.params["ImageId"] == moto_server.image("eu-central-1")
    assert run.params["MetadataOptions"] == {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}
    volume_id = raw["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
    volume = moto_server.client("eu-central-1").describe_volumes(VolumeIds=[volume_id])["Volumes"][0]
    assert tags_of(volume) == expected
    assert (made.region, made.zone, made.instance_type) == ("eu-central-1", "eu-central-1a", "g6.xlarge")


def test_a_running_instance_names_its_agent_on_its_private_address(
    driver: AwsDriver, moto_server: MotoServer
) -> None:
    machine_id = new_machine_id()
    made = driver.create(InstanceSpec(machine_id=machine_id, offering=US))
    ref = InstanceRef(machine_id=machine_id, offering=US)
    (raw,) = moto_server.instances("us-east-1", {MACHINE_LABEL: machine_id})
    assert driver.get(ref).agent_address == f"{raw['PrivateIpAddress']}:50060"
    driver.stop(
        InstanceRef(machine_id=machine_id, offering=US, provider_instance_id=made.provider_instance_id)
    )
    assert driver.get(ref).agent_address == ""


def test_a_region_that_is_not_configured_is_refused_before_any_call(
    moto_server: MotoServer, aws_faults: Ec2Faults
) -> None:
    driver = aws_driver_for(moto_server, aws_faults, DEPLOYMENT, regions=("us-east-1",))
    with pytest.raises(FailedPrecondition) as refused:
        driver.create(InstanceSpec(machine_id=new_machine_id(), offering=EU))
    assert refused.value.field == "offering.region"
    assert aws_faults.operations() == []


def test_an_unknown_instance_type_stays_an_untyped_provider_error(driver: AwsDriver) -> None:
    # moto validates instance types here (MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION), like EC2.
    bogus = Offering(
        provider=Provider.AWS, region="us-east-1", zone="us-east-1a", instance_type="g6.bogus", slots=1
    )
    with pytest.raises(ProviderError) as raised:
        driver.create(InstanceSpec(machine_id=new_machine_id(), offering=bogus))
    assert type(raised.value) is ProviderError
    assert "RunInstances" in raised.value.message


# ---- reading EC2: tags, pages, regions --------------------------------------------------------


def test_list_pages_through_every_region_and_returns_only_our_deployment(
    driver: AwsDriver, moto_server: MotoServer, aws_faults: Ec2Faults
) -> None:
    ours = {new_machine_id(): US for _ in range(7)} | {new_machine_id(): EU for _ in range(3)}
    for machine_id, offering in ours.items():
        driver.create(InstanceSpec(machine_id=machine_id, offering=offering))
    plant(moto_server, "us-east-1", {DEPLOYMENT_LABEL: "someone-else", MACHINE_LABEL: new_machine_id()})
    plant(moto_server, "eu-central-1", None)
    plant(moto_server, "us-east-1", {"Name": "hand-made"})
    aws_faults.calls.clear()

    listed = driver.list()

    assert sorted(i.machine_id for i in listed) == sorted(ours)
    assert {i.machine_id: i.region for i in listed} == {m: o.region for m, o in ours.items()}
    assert all(i.labels[DEPLOYMENT_LABEL] == DEPLOYMENT for i in listed)
    describes = aws_faults.calls_of("DescribeInstances")
    assert {c.region for c in describes} == set(TEST_REGIONS)
    us_pages = [c for c in describes if c.region == "us-east-1"]
    assert len(us_pages) == 2 and "NextToken" in us_pages[1].params  # 7 instances, pages of 5
    assert all(c.params["MaxResults"] == 5 for c in describes)
    for call in describes:
        filters = {f["Name"]: f["Values"] for f in call.params["Filters"]}
        assert filters[f"tag:{DEPLOYMENT_LABEL}"] == [DEPLOYMENT]
        assert "instance-lifecycle" not in filters


def test_a_region_that_cannot_be_read_fails_the_whole_list(driver: AwsDriver, aws_faults: Ec2Faults) -> None:
    driver.create(InstanceSpec(machine_id=new_machine_id(), offering=US))
    aws_faults.fail_next(ErrorAnswer("RequestLimitExceeded", 503), "DescribeInstances", region="eu-central-1")
    with pytest.raises(Transient):
        driver.list()


def test_a_machine_is_found_in_any_configured_region_when_the_ref_names_none(driver: AwsDriver) -> None:
    machine_id = new_machine_id()
    made = driver.create(InstanceSpec(machine_id=machine_id, offering=EU))
    no_region = Offering(provider=Provider.AWS, region="", zone="", instance_type="", slots=1)
    assert driver.get(InstanceRef(machine_id=machine_id, offering=no_region)).provider_instance_id == (
        made.provider_instance_id
    )


def test_terminated_instances_are_gone_though_ec2_still_shows_them(
    driver: AwsDriver, moto_server: MotoServer
) -> None:
    machine_id = new_machine_id()
    driver.create(InstanceSpec(machine_id=machine_id, offering=US))
    ref = InstanceRef(machine_id=machine_id, offering=US)
    assert driver.destroy(ref) is True
    (raw,) = moto_server.instances("us-east-1", {MACHINE_LABEL: machine_id})
    assert raw["State"]["Name"] in ("shutting-down", "terminated")
    with pytest.raises(InstanceNotFound):
        driver.get(ref)
    assert driver.list() == []
    assert driver.destroy(ref) is False


# ---- destroy ------------------------------------------------------------------------------------


def test_destroying_a_spot_machine_cancels_its_persistent_request_first(
    driver: AwsDriver, moto_server: MotoServer, aws_faults: Ec2Faults
) -> None:
    machine_id = new_machine_id()
    made = driver.create(InstanceSpec(machine_id=machine_id, offering=US_SPOT))
    # moto does not link its spot instances to requests; EC2 does. Make a real request in
    # moto and show its id on our instance, as EC2 would.
    request = moto_server.client("us-east-1").request_spot_instances(
        InstanceCount=1,
        Type="persistent",
        InstanceInterruptionBehavior="stop",
        LaunchSpecification={"ImageId": moto_server.image("us-east-1"), "InstanceType": "g6.xlarge"},
    )["SpotInstanceRequests"][0]["SpotInstanceRequestId"]
    aws_faults.describe_with(made.provider_instance_id, SpotInstanceRequestId=request)
    aws_faults.calls.clear()

    assert driver.destroy(InstanceRef(machine_id=machine_id, offering=US_SPOT)) is True

    assert aws_faults.operations() == [
        "DescribeInstances",
        "CancelSpotInstanceRequests",
        "TerminateInstances",
        "DescribeInstances",  # the second read: done only once EC2 says terminated
    ]
    assert aws_faults.calls_of("CancelSpotInstanceRequests")[0].params["SpotInstanceRequestIds"] == [request]
    requests = moto_server.client("us-east-1").describe_spot_instance_requests()["SpotInstanceRequests"]
    assert request not in {r["SpotInstanceRequestId"] for r in requests if r["State"] != "cancelled"}


def test_a_spot_request_already_gone_does_not_stop_the_destroy(
    driver: AwsDriver, aws_faults: Ec2Faults
) -> None:
    machine_id = new_machine_id()
    made = driver.create(InstanceSpec(machine_id=machine_id, offering=US_SPOT))
    aws_faults.describe_with(made.provider_instance_id, SpotInstanceRequestId="sir-00000000")
    aws_faults.fail_next(ErrorAnswer("InvalidSpotInstanceRequestID.NotFound"), "CancelSpotInstanceRequests")
    assert driver.destroy(InstanceRef(machine_id=machine_id, offering=US_SPOT)) is True
    assert driver.list() == []


def test_an_instance_gone_between_look_and_terminate_is_a_destroy_of_nothing(
    driver: AwsDriver, aws_faults: Ec2Faults
) -> None:
    machine_id = new_machine_id()
    driver.create(InstanceSpec(machine_id=machine_id, offering=US))
    aws_faults.fail_next(ErrorAnswer("InvalidInstanceID.NotFound"), "TerminateInstances")
    assert driver.destroy(InstanceRef(machine_id=machine_id, offering=US)) is False


def test_two_instances_of_one_machine_answer_with_the_older_and_both_are_destroyed(
    driver: AwsDriver, moto_server: MotoServer
) -> None:
    machine_id = new_machine_id()
    first = driver.create(InstanceSpec(machine_id=machine_id, offering=US))
    duplicate = plant(moto_server, "us-east-1", {DEPLOYMENT_LABEL: DEPLOYMENT, MACHINE_LABEL: machine_id})
    ref = InstanceRef(machine_id=machine_id, offering=US)
    oldest = min(
        moto_server.instances("us-east-1", {MACHINE_LABEL: machine_id}),
        key=lambda raw: (raw["LaunchTime"], raw["InstanceId"]),
    )["InstanceId"]
    assert driver.get(ref).provider_instance_id == oldest
    assert driver.create(InstanceSpec(machine_id=machine_id, offering=US)).provider_instance_id == oldest
    assert oldest in (first.provider_instance_id, duplicate)

    assert driver.destroy(ref) is True
    assert driver.list() == []


# ---- start and stop ----------------------------------------------------------------------------


def test_a_zone_that_cannot_start_a_stopped_machine_is_insufficient_capacity(
    driver: AwsDriver, aws_faults: Ec2Faults
) -> None:
    machine_id = new_machine_id()
    made = driver.create(InstanceSpec(machine_id=machine_id, offering=US))
    ref = InstanceRef(machine_id=machine_id, offering=US, provider_instance_id=made.provider_instance_id)
    driver.stop(ref)
    aws_faults.fail_next(ErrorAnswer("InsufficientInstanceCapacity", 500), "StartInstances")
    with pytest.raises(InsufficientCapacity):
        driver.start(ref)
    assert driver.get(ref).status is InstanceStatus.STOPPED
    assert driver.start(ref).status in (InstanceStatus.PENDING, InstanceStatus.RUNNING)


def test_starting_or_stopping_twice_calls_ec2_once(driver: AwsDriver, aws_faults: Ec2Faults) -> None:
    machine_id = new_machine_id()
    made = driver.create(InstanceSpec(machine_id=machine_id, offering=US))
    ref = InstanceRef(machine_id=machine_id, offering=US, provider_instance_id=made.provider_instance_id)
    driver.stop(ref)
    driver.stop(ref)
    driver.start(ref)
    driver.start(ref)
    assert [
        op for op in aws_faults.operations() if op.endswith("Instances") and op != "DescribeInstances"
    ] == [
        "RunInstances",
        "StopInstances",
        "StartInstances",
    ]


# ---- the error table, code by code --------------------------------------------------------------

_SERVER_SIDE = {"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
                "InsufficientReservedInstanceCapacity", "InternalError", "InternalFailure",
                "ServiceUnavailable", "Unavailable"}  # fmt: skip
_CASES = [
    *[(code, 500 if code in _SERVER_SIDE else 400, kind) for code, kind in EC2_CODES.items()],
    ("Unsupported", 400, InsufficientCapacity),  # the zone does not offer the type
    ("InvalidParameterValue", 400, ProviderError),  # not ours to guess at: untyped
    ("SomethingNewFromEc2", 503, Transient),  # unknown, but the provider's trouble
]


@pytest.mark.parametrize(("code", "status", "kind"), _CASES, ids=[c[0] for c in _CASES])
def test_each_ec2_error_code_of_run_instances_arrives_typed(
    driver: AwsDriver, moto_server: MotoServer, aws_faults: Ec2Faults, code: str, status: int, kind: type
) -> None:
    machine_id = new_machine_id()
    aws_faults.fail_next(ErrorAnswer(code, status), "RunInstances")
    with pytest.raises(ProviderError) as raised:
        driver.create(InstanceSpec(machine_id=machine_id, offering=US))
    assert type(raised.value) is kind
    assert code in raised.value.message
    assert moto_server.instances("us-east-1", {MACHINE_LABEL: machine_id}) == []


def test_unsupported_from_a_read_is_not_a_stockout(driver: AwsDriver, aws_faults: Ec2Faults) -> None:
    aws_faults.fail_next(ErrorAnswer("Unsupported"), "DescribeInstances")
    with pytest.raises(ProviderError) as raised:
        driver.list()
    assert type(raised.value) is ProviderError


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [("UnauthorizedOperation", 403, AuthFailed), ("VcpuLimitExceeded", 400, QuotaExceeded)],
)
@pytest.mark.parametrize("operation", ["StopInstances", "TerminateInstances"])
def test_errors_of_stop_and_terminate_arrive_typed(
    driver: AwsDriver, aws_faults: Ec2Faults, operation: str, code: str, status: int, kind: type
) -> None:
    machine_id = new_machine_id()
    driver.create(InstanceSpec(machine_id=machine_id, offering=US))
    ref = InstanceRef(machine_id=machine_id, offering=US)
    aws_faults.fail_next(ErrorAnswer(code, status), operation)
    call = {"StopInstances": driver.stop, "TerminateInstances": driver.destroy}[operation]
    with pytest.raises(kind):
        call(ref)
    assert driver.get(ref).status is InstanceStatus.RUNNING


def test_no_credentials_in_the_chain_is_auth_failed(moto_server: MotoServer) -> None:
    bare = botocore.session.Session()
    bare.register_component("credential_provider", CredentialResolver(providers=[]))
    clients = Ec2Clients(boto3.Session(botocore_session=bare), endpoint_url=moto_server.url)
    driver = AwsDriver(DEPLOYMENT, AwsOptions(regions=("us-east-1",), images={"us-east-1": "ami-x"}), clients)
    with pytest.raises(AuthFailed):
        driver.list()
    with pytest.raises(AuthFailed):
        driver.create(InstanceSpec(machine_id=new_machine_id(), offering=US))


def test_an_endpoint_that_refuses_connections_is_transient() -> None:
    clients = Ec2Clients(
        boto3.Session(aws_access_key_id="x", aws_secret_access_key="y"),
        endpoint_url="http://127.0.0.1:9",  # discard port: nothing listens
        bounds=ClientBounds(connect_timeout_s=1, read_timeout_s=1, max_attempts=2),
    )
    driver = AwsDriver(DEPLOYMENT, AwsOptions(regions=("us-east-1",), images={"us-east-1": "ami-x"}), clients)
    with pytest.raises(Transient):
        driver.list()


# ---- the provisioner process, over gRPC -------------------------------------------------------

US_PB = machine_pb2.Offering(
    provider=machine_pb2.PROVIDER_AWS,
    region="us-east-1",
    zone="us-east-1b",
    instance_type="g6.xlarge",
    slots=1,
    gpu_model="L4",
    capacity_type=machine_pb2.CAPACITY_TYPE_SPOT,
)
EU_PB = machine_pb2.Offering(
    provider=machine_pb2.PROVIDER_AWS,
    region="eu-central-1",
    zone="eu-central-1a",
    instance_type="g6.xlarge",
    slots=1,
)


@pytest.fixture
def aws_provisioner(
    tmp_path: Path, moto_server: MotoServer, aws_faults: Ec2Faults
) -> Iterator[ServiceProcess]:
    env = {
        **credentials_env(),
        "GPUFLEET_DEPLOYMENT_ID": "proc-aws",
        "GPUFLEET_DRIVERS": "aws",
        "GPUFLEET_AWS_REGIONS": ",".join(TEST_REGIONS),
        "GPUFLEET_AWS_IMAGES": json.dumps({r: moto_server.image(r) for r in TEST_REGIONS}),
        "GPUFLEET_AWS_ENDPOINT_URL": moto_server.url,
        "GPUFLEET_AWS_PAGE_SIZE": "5",
        "GPUFLEET_AWS_MAX_ATTEMPTS": "2",
        "GPUFLEET_LOG_FORMAT": "text",
    }
    service = start_service("provisioner", tmp_path, env)
    yield service
    service.stop()


def test_the_provisioner_process_drives_ec2_end_to_end(
    aws_provisioner: ServiceProcess, moto_server: MotoServer
) -> None:
    foreign = plant(moto_server, "us-east-1", {DEPLOYMENT_LABEL: "someone-else", MACHINE_LABEL: "m-foreign"})
    plant(moto_server, "eu-central-1", None)
    client = ProvisionerClient(
        aws_provisioner.address, tls.transport("scheduler", aws_provisioner.deployment), timeout_s=30
    )
    try:
        spot = client.create("m-spot", US_PB, request_id="r-1")
        on_demand = client.create("m-eu", EU_PB, request_id="r-2")
        assert (
            client.create("m-spot", US_PB, request_id="r-3").provider_instance_id == spot.provider_instance_id
        )
        assert spot.capacity_type == machine_pb2.CAPACITY_TYPE_SPOT
        assert spot.labels[DEPLOYMENT_LABEL] == "proc-aws"

        instances, unreachable = client.list_all()
        assert unreachable == []
        assert sorted((i.machine_id, i.region) for i in instances) == [
            ("m-eu", "eu-central-1"),
            ("m-spot", "us-east-1"),
        ]

        client.stop("m-spot", US_PB, spot.provider_instance_id, request_id="r-4")
        stopped = client.get("m-spot", US_PB, spot.provider_instance_id)
        assert stopped.status == provisioner_service_pb2.INSTANCE_STATUS_STOPPED
        started = client.start("m-spot", US_PB, spot.provider_instance_id, request_id="r-5")
        assert started.provider_instance_id == spot.provider_instance_id

        assert client.destroy("m-spot", US_PB, spot.provider_instance_id, request_id="r-6") is True
        assert client.destroy("m-spot", US_PB, spot.provider_instance_id, request_id="r-7") is False
        with pytest.raises(InstanceNotFound):
            client.get("m-spot", US_PB, spot.provider_instance_id)
        with pytest.raises(FailedPrecondition):
            client.create(
                "m-far",
                machine_pb2.Offering(
                    provider=machine_pb2.PROVIDER_AWS,
                    region="ap-south-1",
                    zone="ap-south-1a",
                    instance_type="g6.xlarge",
                    slots=1,
                ),
                request_id="r-8",
            )
        instances, _ = client.list_all()
        assert [(i.machine_id, i.provider_instance_id) for i in instances] == [
            ("m-eu", on_demand.provider_instance_id)
        ]
    finally:
        client.close()
    (planted,) = [i for i in moto_server.instances("us-east-1") if i["InstanceId"] == foreign]
    assert planted["State"]["Name"] == "running"  # another deployment's instance untouched


def test_a_machine_is_born_with_its_own_certificate_in_its_user_data(
    moto_server: MotoServer, aws_faults: Ec2Faults
) -> None:
    import base64
    import json

    from cryptography import x509

    from gpufleet.common.trust.pki import machine_ca_subject
    from tests.support import tls

    driver = aws_driver_for(
        moto_server, aws_faults, DEPLOYMENT, machine_issuer=tls.machine_issuer(DEPLOYMENT)
    )
    machine_id = new_machine_id()
    made = driver.create(InstanceSpec(machine_id=machine_id, offering=EU))
    answer = moto_server.client("eu-central-1").describe_instance_attribute(
        InstanceId=made.provider_instance_id, Attribute="userData"
    )
    doc = json.loads(base64.b64decode(answer["UserData"]["Value"]))["gpufleet"]
    assert (doc["machine_id"], doc["deployment_id"]) == (machine_id, DEPLOYMENT)
    cert = x509.load_pem_x509_certificate(doc["tls-cert"].encode())
    uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert uris.get_values_for_type(x509.UniformResourceIdentifier) == [
        f"spiffe://gpufleet.{DEPLOYMENT}/machine/{machine_id}"
    ]
    assert cert.issuer == machine_ca_subject(DEPLOYMENT)
    (run,) = aws_faults.calls_of("RunInstances")
    assert run.params["MetadataOptions"] == {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}
