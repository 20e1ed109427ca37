"""The provider's own list, as both sweeper passes read it (through the provisioner).

Nothing here touches the database: :class:`ListedInstance` is what matching needs of one
listed instance, and :class:`Provisioner` is the part of ``ProvisionerClient`` the
sweeper calls (a test passes its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from gpufleet.common.convert import enum_name
from gpufleet.v1 import machine_pb2, provisioner_service_pb2

MACHINE_LABEL = "gpufleet-machine"
DEPLOYMENT_LABEL = "gpufleet-deployment"


def provider_name(number: int) -> str:
    """``PROVIDER_AWS`` (as a number) -> ``AWS``, the name the store keeps."""
    return enum_name(machine_pb2.Provider, "PROVIDER_", number)


@dataclass(frozen=True)
class ListedInstance:
    """One instance from a provider's list, reduced to what matching needs."""

    provider: str
    provider_instance_id: str
    machine_label: str | None
    status: str
    deployment_label: str | None = None
    launch_time: datetime | None = None
    region: str = ""
    zone: str = ""
    instance_type: str = ""
    capacity_type: str = ""
    stopped_by_itself: bool = False
    agent_address: str = ""

    @classmethod
    def from_proto(cls, inst: provisioner_service_pb2.Instance) -> ListedInstance:
        label = inst.labels.get(MACHINE_LABEL) or inst.machine_id or None
        return cls(
            provider=provider_name(inst.provider),
            provider_instance_id=inst.provider_instance_id,
            machine_label=label,
            status=enum_name(provisioner_service_pb2.InstanceStatus, "INSTANCE_STATUS_", inst.status),
            deployment_label=inst.labels.get(DEPLOYMENT_LABEL) or None,
            launch_time=inst.launch_time.ToDatetime(tzinfo=UTC) if inst.HasField("launch_time") else None,
            region=inst.region,
            zone=inst.zone,
            instance_type=inst.instance_type,
            capacity_type=enum_name(machine_pb2.CapacityType, "CAPACITY_TYPE_", inst.capacity_type),
            stopped_by_itself=inst.stopped_by_itself,
            agent_address=inst.agent_address,
        )


class Provisioner(Protocol):
    """What the sweeper asks of the provisioner; ``ProvisionerClient`` satisfies it.

    Each method raises a typed ``ProviderError`` (``Transient`` when the provisioner
    itself cannot be reached).
    """

    def list_all(self, provider: int = 0) -> tuple[list[provisioner_service_pb2.Instance], list[int]]:
        """Every instance labelled with our deployment, and the providers (numbers) that
        could not be listed this time (no conclusion may be drawn from their absence)."""
        ...

    def get(
        self, machine_id: str, offering: machine_pb2.Offering, provider_instance_id: str
    ) -> provisioner_service_pb2.Instance:
        """A fresh read of one instance; ``InstanceNotFound`` when it is gone."""
        ...

    def destroy(
        self, machine_id: str, offering: machine_pb2.Offering, provider_instance_id: str, request_id: str
    ) -> bool:
        """Destroy one instance (idempotent); False when it was already gone."""
        ...
