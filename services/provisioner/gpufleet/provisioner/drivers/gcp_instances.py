"""Compute Engine instances as gpufleet sees them: names, the insert body, statuses.

Statuses. GCE's lifecycle has more states than :class:`InstanceStatus`; they map as:

=====================================================  =========  =============================
GCE ``status``                                          gpufleet   why
=====================================================  =========  =============================
PENDING, PROVISIONING, STAGING                          PENDING    on its way up
RUNNING                                                 RUNNING
REPAIRING                                               PENDING    host fault; GCE brings it back
STOPPING, SUSPENDING, PENDING_STOP, DEPROVISIONING      STOPPING   on its way down
TERMINATED, STOPPED, SUSPENDED                          STOPPED    see below
anything new                                            PENDING    never reads as "down"
=====================================================  =========  =============================

A GCE ``TERMINATED`` instance is a **stopped** instance: its boot disk is kept and
``instances.start`` brings it back (a spot instance reclaimed with
``instanceTerminationAction=STOP`` lands here too — the sweeper tells that pre-emption from
a deliberate stop by the machine's intent). It is never gpufleet's ``TERMINATED``, which
means gone; a deleted GCE instance simply stops existing (404). A ``SUSPENDED`` instance
is stopped too (no compute billed); starting it resumes it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from google.cloud import compute_v1

from gpufleet.common.errors import InvalidArgument
from gpufleet.provisioner.drivers.base import (
    MACHINE_LABEL,
    CapacityType,
    InstanceInfo,
    InstanceSpec,
    InstanceStatus,
    Provider,
)

__all__ = [
    "L4_MACHINE_TYPES",
    "Recipe",
    "check_label_value",
    "gce_status",
    "instance_body",
    "instance_name",
    "to_info",
]

# The g2-standard family: NVIDIA L4 GPUs, attached by the machine type itself.
L4_MACHINE_TYPES: dict[str, int] = {
    "g2-standard-4": 1,
    "g2-standard-8": 1,
    "g2-standard-12": 1,
    "g2-standard-16": 1,
    "g2-standard-24": 2,
    "g2-standard-32": 1,
    "g2-standard-48": 4,
    "g2-standard-96": 8,
}

_STATUS: dict[str, InstanceStatus] = {
    "PENDING": InstanceStatus.PENDING,
    "PROVISIONING": InstanceStatus.PENDING,
    "STAGING": InstanceStatus.PENDING,
    "REPAIRING": InstanceStatus.PENDING,
    "RUNNING": InstanceStatus.RUNNING,
    "STOPPING": InstanceStatus.STOPPING,
    "SUSPENDING": InstanceStatus.STOPPING,
    "PENDING_STOP": InstanceStatus.STOPPING,
    "DEPROVISIONING": InstanceStatus.STOPPING,
    "TERMINATED": InstanceStatus.STOPPED,
    "STOPPED": InstanceStatus.STOPPED,
    "SUSPENDED": InstanceStatus.STOPPED,
}

# GCE label values: lowercase letters, digits, '_' and '-', at most 63 characters.
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
# A machine id usable as-is after "gf-" in an instance name ([a-z]([-a-z0-9]*[a-z0-9])?, <= 63).
_NAME_SUFFIX = re.compile(r"[a-z0-9]([-a-z0-9]{0,58}[a-z0-9])?")


def gce_status(status: str) -> InstanceStatus:
    """The gpufleet status of a GCE status (see the module docstring)."""
    return _STATUS.get(status, InstanceStatus.PENDING)


def check_label_value(value: str, field: str) -> str:
    if not value or not _LABEL_VALUE.fullmatch(value):
        raise InvalidArgument(
            "must be a GCE label value: 1-63 lowercase letters, digits, '_' or '-'", field=field
        )
    return value


def instance_name(machine_id: str) -> str:
    """The instance's name, derived from the machine id alone so a retried create finds it.

    ``gf-<machine id>`` when the id can be part of a name (uuids can); otherwise (an id with
    '_', say) ``gfh-`` and a digest of it, which no ``gf-`` name can equal.
    """
    if _NAME_SUFFIX.fullmatch(machine_id):
        return f"gf-{machine_id}"
    return "gfh-" + hashlib.sha256(machine_id.encode()).hexdigest()[:40]


def _last(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def _timestamp(text: str) -> datetime | None:
    """An RFC 3339 timestamp as GCE writes it (``2026-01-01T09:00:00.123-08:00``)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def to_info(inst: Any, agent_port: int) -> InstanceInfo:
    """What ``compute_v1.Instance`` ``inst`` says, as an InstanceInfo.

    The provider instance id is GCE's numeric id, never reused (a name can be, after a
    delete). The agent answers on the first interface's internal address once RUNNING.
    """
    status = gce_status(inst.status)
    zone = _last(inst.zone)
    nics = list(inst.network_interfaces)
    address = nics[0].network_i_p if nics else ""
    scheduling = inst.scheduling
    spot = scheduling.provisioning_model == "SPOT" or bool(scheduling.preemptible)
    labels = dict(inst.labels)
    return InstanceInfo(
        provider=Provider.GCP,
        provider_instance_id=str(inst.id),
        machine_id=labels.get(MACHINE_LABEL, ""),
        status=status,
        labels=labels,
        launch_time=_timestamp(inst.creation_timestamp),
        region=zone.rsplit("-", 1)[0],
        zone=zone,
        instance_type=_last(inst.machine_type),
        capacity_type=CapacityType.SPOT if spot else CapacityType.ON_DEMAND,
        agent_address=f"{address}:{agent_port}" if status is InstanceStatus.RUNNING and address else "",
    )


@dataclass(frozen=True)
class Recipe:
    """How every machine is built (DESIGN: interchangeable, from the same recipe)."""

    image: str
    boot_disk_gb: int = 100
    boot_disk_type: str = "pd-balanced"
    network: str = "global/networks/default"
    subnetwork: str = ""
    external_ip: bool = False
    agent_port: int = 50060
    scheduler_address: str = ""


def _scheduling(capacity: CapacityType) -> compute_v1.Scheduling:
    # A GPU cannot live-migrate: host maintenance stops the machine either way.
    if capacity is CapacityType.SPOT:
        return compute_v1.Scheduling(
            provisioning_model="SPOT",
            instance_termination_action="STOP",  # a reclaimed spot machine keeps its disk
            on_host_maintenance="TERMINATE",
            automatic_restart=False,
        )
    return compute_v1.Scheduling(
        provisioning_model="STANDARD", on_host_maintenance="TERMINATE", automatic_restart=True
    )


def instance_body(
    name: str,
    spec: InstanceSpec,
    labels: Mapping[str, str],
    recipe: Recipe,
    deployment_id: str,
    credential: Mapping[str, str] | None = None,
) -> compute_v1.Instance:
    """The ``instances.insert`` body: labels on the instance and its disk, no service account
    (a machine holds no cloud credential), the L4s come with the g2 machine type."""
    zone = spec.offering.zone
    nic = compute_v1.NetworkInterface(
        network=recipe.network or None,
        subnetwork=recipe.subnetwork or None,
        access_configs=(
            [compute_v1.AccessConfig(name="external-nat", type_="ONE_TO_ONE_NAT")]
            if recipe.external_ip
            else []
        ),
    )
    disk = compute_v1.AttachedDisk(
        boot=True,
        auto_delete=True,
        initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=recipe.image,
            disk_size_gb=recipe.boot_disk_gb,
            disk_type=f"zones/{zone}/diskTypes/{recipe.boot_disk_type}",
            labels=dict(labels),
        ),
    )
    # What the recipe's agent reads at boot to know who it is, and its own credential
    # (gpufleet-tls-ca/-cert/-key: this instance's certificate, which no other instance is
    # given; the walls keep every job away from the metadata server).
    metadata = {
        "gpufleet-machine-id": spec.machine_id,
        "gpufleet-deployment-id": deployment_id,
        "gpufleet-slots": str(spec.offering.slots),
        "gpufleet-agent-port": str(recipe.agent_port),
        "gpufleet-scheduler-address": recipe.scheduler_address,
        **{f"gpufleet-{key}": value for key, value in (credential or {}).items()},
    }
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/{spec.offering.instance_type}",
        labels=dict(labels),
        disks=[disk],
        network_interfaces=[nic],
        scheduling=_scheduling(spec.offering.capacity_type),
        service_accounts=[],
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in metadata.items()]),
    )
