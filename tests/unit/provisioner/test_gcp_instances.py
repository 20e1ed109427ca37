"""Compute Engine instances as gpufleet sees them: statuses, names, the insert body, InstanceInfo."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from google.cloud import compute_v1

from gpufleet.common.errors import InvalidArgument
from gpufleet.provisioner.drivers.base import (
    DEPLOYMENT_LABEL,
    MACHINE_LABEL,
    CapacityType,
    InstanceSpec,
    InstanceStatus,
    Offering,
    Provider,
)
from gpufleet.provisioner.drivers.gcp_instances import (
    Recipe,
    check_label_value,
    gce_status,
    instance_body,
    instance_name,
    to_info,
)

GCE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


@pytest.mark.parametrize(
    ("gce", "ours"),
    [
        ("PROVISIONING", InstanceStatus.PENDING),
        ("STAGING", InstanceStatus.PENDING),
        ("PENDING", InstanceStatus.PENDING),
        ("RUNNING", InstanceStatus.RUNNING),
        ("REPAIRING", InstanceStatus.PENDING),
        ("STOPPING", InstanceStatus.STOPPING),
        ("SUSPENDING", InstanceStatus.STOPPING),
        ("PENDING_STOP", InstanceStatus.STOPPING),
        ("DEPROVISIONING", InstanceStatus.STOPPING),
        # GCE's TERMINATED keeps its disk and can start again: stopped, never gone.
        ("TERMINATED", InstanceStatus.STOPPED),
        ("STOPPED", InstanceStatus.STOPPED),
        ("SUSPENDED", InstanceStatus.STOPPED),
        ("A_STATUS_FROM_THE_FUTURE", InstanceStatus.PENDING),
    ],
)
def test_gce_statuses_map_to_ours(gce: str, ours: InstanceStatus) -> None:
    assert gce_status(gce) is ours


def test_no_gce_status_reads_as_gone() -> None:
    for status in compute_v1.Instance.Status.__members__:
        assert gce_status(status) is not InstanceStatus.TERMINATED


def test_a_uuid_machine_id_names_its_instance_directly() -> None:
    machine_id = "0b7e8f0c-5f0e-4d71-9d7c-3b1a2c4d5e6f"
    assert instance_name(machine_id) == f"gf-{machine_id}"
    assert GCE_NAME.fullmatch(instance_name(machine_id))


@pytest.mark.parametrize("machine_id", ["m_1", "ends-with-dash-", "x" * 63, "9-starts-with-digit"])
def test_any_machine_id_gives_a_valid_stable_name(machine_id: str) -> None:
    name = instance_name(machine_id)
    assert GCE_NAME.fullmatch(name), name
    assert instance_name(machine_id) == name
    assert len({instance_name("m_1"), instance_name("m-1")}) == 2


@pytest.mark.parametrize("value", ["", "UPPER", "has space", "x" * 64, "dot.ted"])
def test_label_values_follow_gce_rules(value: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_label_value(value, "machine_id")
    assert raised.value.field == "machine_id"


def _instance(status: str = "RUNNING", **scheduling: object) -> compute_v1.Instance:
    return compute_v1.Instance(
        id=6105395321733014149,
        name="gf-m-1",
        status=status,
        zone="https://www.googleapis.com/compute/v1/projects/p/zones/europe-west4-a",
        machine_type="https://www.googleapis.com/compute/v1/projects/p/zones/europe-west4-a/machineTypes/g2-standard-8",
        creation_timestamp="2026-03-01T09:30:00.250-08:00",
        labels={DEPLOYMENT_LABEL: "dep", MACHINE_LABEL: "m-1"},
        network_interfaces=[compute_v1.NetworkInterface(network_i_p="10.164.0.7")],
        scheduling=compute_v1.Scheduling(**scheduling),
    )


def test_an_instance_becomes_instance_info() -> None:
    info = to_info(_instance(provisioning_model="SPOT"), agent_port=50060)
    assert info.provider is Provider.GCP
    assert info.provider_instance_id == "6105395321733014149"
    assert (info.machine_id, info.zone, info.region, info.instance_type) == (
        "m-1",
        "europe-west4-a",
        "europe-west4",
        "g2-standard-8",
    )
    assert info.launch_time == datetime(2026, 3, 1, 17, 30, 0, 250000, tzinfo=UTC)
    assert info.capacity_type is CapacityType.SPOT
    assert info.agent_address == "10.164.0.7:50060"


def test_the_agent_address_is_known_only_while_running() -> None:
    assert to_info(_instance("STAGING"), agent_port=50060).agent_address == ""
    assert to_info(_instance("TERMINATED"), agent_port=50060).agent_address == ""


def test_an_old_style_preemptible_instance_is_spot() -> None:
    assert to_info(_instance(preemptible=True), 1).capacity_type is CapacityType.SPOT
    assert to_info(_instance(provisioning_model="STANDARD"), 1).capacity_type is CapacityType.ON_DEMAND


def test_the_insert_body() -> None:
    offering = Offering(
        provider=Provider.GCP,
        region="us-central1",
        zone="us-central1-b",
        instance_type="g2-standard-12",
        slots=3,
        capacity_type=CapacityType.SPOT,
    )
    labels = {DEPLOYMENT_LABEL: "dep", MACHINE_LABEL: "m-1"}
    recipe = Recipe(image="projects/i/global/images/family/f", subnetwork="regions/us-central1/subnetworks/s")
    body = instance_body("gf-m-1", InstanceSpec("m-1", offering), labels, recipe, "dep")
    assert body.machine_type == "zones/us-central1-b/machineTypes/g2-standard-12"
    assert (body.scheduling.provisioning_model, body.scheduling.instance_termination_action) == (
        "SPOT",
        "STOP",
    )
    assert body.scheduling.automatic_restart is False
    assert body.disks[0].initialize_params.disk_type == "zones/us-central1-b/diskTypes/pd-balanced"
    assert list(body.network_interfaces[0].access_configs) == []  # no external address
    assert list(body.service_accounts) == []
    assert dict(body.labels) == labels
    assert {i.key: i.value for i in body.metadata.items}["gpufleet-slots"] == "3"
