"""The aws driver's own decisions, with EC2's answers scripted by botocore's Stubber on the
client the driver is given (no server): what it asks EC2 in states moto never holds long
enough to observe (stopping, pending), how it reads an instance, what it launches with,
and how settings build it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from pydantic import ValidationError

from gpufleet.common.clock import ManualClock
from gpufleet.common.provider_errors import ProviderError, Transient
from gpufleet.provisioner.drivers.aws import AwsDriver, AwsOptions
from gpufleet.provisioner.drivers.base import (
    DEPLOYMENT_LABEL,
    MACHINE_LABEL,
    CapacityType,
    InstanceRef,
    InstanceSpec,
    InstanceStatus,
    Offering,
    Provider,
)
from gpufleet.provisioner.drivers.factory import build_drivers
from gpufleet.provisioner.settings import Settings

DEPLOYMENT = "dep-1"
MACHINE = "m-1"
OFFERING = Offering(
    provider=Provider.AWS, region="us-east-1", zone="us-east-1a", instance_type="g6.xlarge", slots=1
)
REF = InstanceRef(machine_id=MACHINE, offering=OFFERING)
CREATED = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def session() -> boto3.Session:
    return boto3.Session(aws_access_key_id="x", aws_secret_access_key="y")


@pytest.fixture
def ec2(session: boto3.Session) -> Iterator[tuple[Any, Stubber]]:
    client = session.client("ec2", region_name="us-east-1")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def options(**overrides: Any) -> AwsOptions:
    return AwsOptions(regions=("us-east-1",), images={"us-east-1": "ami-gpu"}, **overrides)


def raw_instance(state: str, **fields: Any) -> dict[str, Any]:
    return {
        "InstanceId": "i-0aaaaaaaaaaaaaaa1",
        "InstanceType": "g6.xlarge",
        "State": {"Name": state, "Code": 0},
        "Placement": {"AvailabilityZone": "us-east-1a"},
        "LaunchTime": CREATED,
        "PrivateIpAddress": "10.0.0.7",
        "Tags": [{"Key": DEPLOYMENT_LABEL, "Value": DEPLOYMENT}, {"Key": MACHINE_LABEL, "Value": MACHINE}],
        **fields,
    }


def described(*instances: dict[str, Any]) -> dict[str, Any]:
    return {"Reservations": [{"Instances": list(instances)}]}


def test_start_while_stopping_is_transient_and_asks_ec2_nothing(ec2: tuple[Any, Stubber]) -> None:
    client, stubber = ec2
    stubber.add_response("describe_instances", described(raw_instance("stopping")))
    driver = AwsDriver(DEPLOYMENT, options(), lambda _region: client)
    with pytest.raises(Transient):
        driver.start(REF)


def test_stop_of_a_pending_instance_that_ec2_refuses_is_transient(ec2: tuple[Any, Stubber]) -> None:
    client, stubber = ec2
    stubber.add_response("describe_instances", described(raw_instance("pending")))
    stubber.add_client_error("stop_instances", "IncorrectInstanceState", http_status_code=400)
    driver = AwsDriver(DEPLOYMENT, options(), lambda _region: client)
    with pytest.raises(Transient):
        driver.stop(REF)


def test_start_answers_with_the_state_ec2_moved_it_to(ec2: tuple[Any, Stubber]) -> None:
    client, stubber = ec2
    stubber.add_response("describe_instances", described(raw_instance("stopped")))
    stubber.add_response(
        "start_instances",
        {
            "StartingInstances": [
                {
                    "InstanceId": "i-0aaaaaaaaaaaaaaa1",
                    "CurrentState": {"Name": "pending", "Code": 0},
                    "PreviousState": {"Name": "stopped", "Code": 80},
                }
            ]
        },
        {"InstanceIds": ["i-0aaaaaaaaaaaaaaa1"]},
    )
    driver = AwsDriver(DEPLOYMENT, options(), lambda _region: client)
    started = driver.start(REF)
    assert (started.status, started.agent_address) == (InstanceStatus.PENDING, "")


def test_an_instance_reads_as_the_platform_needs_it(ec2: tuple[Any, Stubber]) -> None:
    client, stubber = ec2
    # Restarted an hour ago: LaunchTime moved, the root volume's attach time did not.
    restarted = raw_instance(
        "running",
        LaunchTime=CREATED + timedelta(hours=5),
        RootDeviceName="/dev/sda1",
        InstanceLifecycle="spot",
        BlockDeviceMappings=[
            {"DeviceName": "/dev/sda1", "Ebs": {"AttachTime": CREATED, "VolumeId": "vol-1"}},
            {
                "DeviceName": "/dev/sdb",
                "Ebs": {"AttachTime": CREATED - timedelta(days=9), "VolumeId": "vol-2"},
            },
        ],
    )
    stubber.add_response("describe_instances", described(restarted))
    info = AwsDriver(DEPLOYMENT, options(agent_port=7000), lambda _region: client).get(REF)
    assert info.launch_time == CREATED  # the root volume's, not a data volume's older one
    assert info.capacity_type is CapacityType.SPOT
    assert info.agent_address == "10.0.0.7:7000"
    assert (info.machine_id, info.region, info.zone) == (MACHINE, "us-east-1", "us-east-1a")


def test_an_instance_of_another_deployment_is_not_ours_even_if_ec2_returns_it(
    ec2: tuple[Any, Stubber],
) -> None:
    client, stubber = ec2
    foreign = raw_instance("running", Tags=[{"Key": DEPLOYMENT_LABEL, "Value": "other"}])
    stubber.add_response("describe_instances", described(foreign))
    assert AwsDriver(DEPLOYMENT, options(), lambda _region: client).list() == []


def test_a_state_ec2_never_documented_is_an_error_not_a_guess(ec2: tuple[Any, Stubber]) -> None:
    client, stubber = ec2
    stubber.add_response("describe_instances", described(raw_instance("hibernating")))
    with pytest.raises(ProviderError):
        AwsDriver(DEPLOYMENT, options(), lambda _region: client).get(REF)


def test_the_launch_request_uses_the_zone_subnet_and_region_groups(ec2: tuple[Any, Stubber]) -> None:
    client, _ = ec2
    driver = AwsDriver(
        DEPLOYMENT,
        options(subnets={"us-east-1a": "subnet-a"}, security_groups={"us-east-1": ("sg-1", "sg-2")}),
        lambda _region: client,
    )
    request = driver.launch_request("us-east-1", InstanceSpec(machine_id=MACHINE, offering=OFFERING))
    assert request["SubnetId"] == "subnet-a"
    assert request["SecurityGroupIds"] == ["sg-1", "sg-2"]
    assert request["ImageId"] == "ami-gpu"
    assert "IamInstanceProfile" not in request  # a machine holds no cloud credential
    other_zone = InstanceSpec(
        machine_id=MACHINE, offering=Offering(**{**OFFERING.__dict__, "zone": "us-east-1b"})
    )
    assert "SubnetId" not in driver.launch_request("us-east-1", other_zone)


# ---- settings and the factory -------------------------------------------------------------------


def test_aws_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_DRIVERS", "aws")
    monkeypatch.setenv("GPUFLEET_AWS_REGIONS", "us-east-1, eu-central-1")
    monkeypatch.setenv("GPUFLEET_AWS_IMAGES", '{"us-east-1": "ami-1", "eu-central-1": "ami-2"}')
    monkeypatch.setenv("GPUFLEET_AWS_SECURITY_GROUPS", '{"us-east-1": ["sg-1"]}')
    monkeypatch.setenv("GPUFLEET_AWS_ENDPOINT_URL", "http://127.0.0.1:5000")
    monkeypatch.setenv("GPUFLEET_AWS_PAGE_SIZE", "50")
    settings = Settings()
    assert settings.aws_regions == ["us-east-1", "eu-central-1"]
    assert settings.aws_images == {"us-east-1": "ami-1", "eu-central-1": "ami-2"}
    assert settings.aws_security_groups == {"us-east-1": ["sg-1"]}
    assert (settings.aws_endpoint_url, settings.aws_page_size) == ("http://127.0.0.1:5000", 50)
    drivers = build_drivers(settings, ManualClock())
    assert set(drivers) == {Provider.AWS}
    assert drivers[Provider.AWS].deployment_id == settings.deployment_id


def test_no_setting_carries_a_credential() -> None:
    # A cloud credential comes from the SDK's own chain, never a setting. The TLS settings
    # (``*_file``) name where this process's own key lies; they carry no secret themselves.
    values = [name for name in Settings.model_fields if not name.endswith("_file")]
    assert not [name for name in values if any(w in name for w in ("key", "secret", "token"))]
    assert {"tls_key_file", "tls_machine_ca_key_file"} <= set(Settings.model_fields)


@pytest.mark.parametrize(
    ("regions", "images", "complaint"),
    [([], {}, "GPUFLEET_AWS_REGIONS"), (["us-east-1", "us-west-2"], {"us-east-1": "ami-1"}, "us-west-2")],
)
def test_an_aws_driver_that_cannot_launch_everywhere_fails_at_start(
    regions: list[str], images: dict[str, str], complaint: str
) -> None:
    settings = Settings(drivers=[Provider.AWS], aws_regions=regions, aws_images=images)
    with pytest.raises(ValueError, match=complaint):
        build_drivers(settings, ManualClock())


def test_a_page_size_ec2_would_refuse_is_refused_here() -> None:
    with pytest.raises(ValidationError):
        Settings(aws_page_size=2)


@pytest.mark.parametrize(
    ("state", "reason", "by_itself"),
    [
        ("stopped", "Client.InstanceInitiatedShutdown", True),  # shutdown -h from inside
        ("stopped", "Client.UserInitiatedShutdown", False),  # an API or console stop
        ("stopped", None, False),
        ("running", "Client.InstanceInitiatedShutdown", False),  # an old reason, running again
    ],
)
def test_ec2_says_whether_an_instance_stopped_itself(state: str, reason: str | None, by_itself: bool) -> None:
    from gpufleet.provisioner.drivers.aws_instances import instance_info

    raw: dict[str, Any] = {
        "InstanceId": "i-1",
        "State": {"Name": state},
        "Tags": [{"Key": "gpufleet-machine", "Value": "m-1"}],
        "Placement": {"AvailabilityZone": "us-east-1a"},
        "InstanceType": "g6.xlarge",
    }
    if reason:
        raw["StateReason"] = {"Code": reason, "Message": reason}
    info = instance_info("us-east-1", raw, 50060)
    assert info is not None and info.stopped_by_itself is by_itself
