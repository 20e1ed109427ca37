"""How the aws driver reads one EC2 instance (a DescribeInstances / RunInstances item).

- ``pending``, ``running``, ``stopping``, ``stopped`` are the live states; a ``terminated``
  instance is gone (:func:`instance_info` returns None), and a state EC2 never documented
  is an error rather than a guess. ``shutting-down`` is an instance still *ending*: read as
  STOPPING — a terminate has been accepted, and EC2 has not confirmed it yet (it can stay
  there for a while, and occasionally for hours) — never as gone. Lists leave it out
  (:data:`LIVE_STATES`); a read of one machine's instance and a destroy see it
  (:data:`ENDING_STATES`), so a destroy is done only once EC2 says terminated.
- Spot or on-demand comes from ``InstanceLifecycle`` (never from the ``instance-lifecycle``
  filter, which moto does not implement).
- The launch time is when the instance was *created*: EC2's ``LaunchTime`` moves on every
  start, while the root volume's and the primary network interface's attach times stay
  fixed for the instance's life, so the earliest of the three is reported (the orphan
  sweep's grace window counts from it).
- The agent's address is the private address and the configured port, while running.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from gpufleet.common.provider_errors import ProviderError
from gpufleet.provisioner.drivers.base import (
    MACHINE_LABEL,
    CapacityType,
    InstanceInfo,
    InstanceStatus,
    Provider,
)

__all__ = ["ENDING_STATES", "LIVE_STATES", "created_at", "instance_info", "moved"]

_STATUS = {
    "pending": InstanceStatus.PENDING,
    "running": InstanceStatus.RUNNING,
    "stopping": InstanceStatus.STOPPING,
    "stopped": InstanceStatus.STOPPED,
    "shutting-down": InstanceStatus.STOPPING,
}
LIVE_STATES = ("pending", "running", "stopping", "stopped")
"""EC2 states of an instance that still exists for us in a list (shutting-down bills
nothing and needs nothing more from a list's reader; terminated is gone)."""

ENDING_STATES = (*LIVE_STATES, "shutting-down")
"""What a read of one machine's instance, and a destroy, see: the live states and an
instance whose terminate EC2 has not finished."""

_GONE = frozenset({"terminated"})


def _utc(value: Any) -> datetime | None:
    return value.astimezone(UTC) if isinstance(value, datetime) else None


def created_at(raw: Mapping[str, Any]) -> datetime | None:
    """When the instance was created (module docstring)."""
    times = [_utc(raw.get("LaunchTime"))]
    root = raw.get("RootDeviceName")
    for mapping in raw.get("BlockDeviceMappings") or []:
        if root is None or mapping.get("DeviceName") == root:
            times.append(_utc((mapping.get("Ebs") or {}).get("AttachTime")))
    for eni in raw.get("NetworkInterfaces") or []:
        attachment = eni.get("Attachment") or {}
        if attachment.get("DeviceIndex", 0) == 0:
            times.append(_utc(attachment.get("AttachTime")))
    known = [t for t in times if t is not None]
    return min(known) if known else None


def instance_info(region: str, raw: Mapping[str, Any], agent_port: int) -> InstanceInfo | None:
    """What the platform sees of one EC2 instance; None once it is terminated."""
    state = str((raw.get("State") or {}).get("Name", ""))
    if state in _GONE:
        return None
    status = _STATUS.get(state)
    if status is None:
        raise ProviderError(f"EC2 instance {raw.get('InstanceId')} is in an unknown state {state!r}")
    tags = {str(t["Key"]): str(t.get("Value", "")) for t in raw.get("Tags") or []}
    address = raw.get("PrivateIpAddress") or ""
    running = status is InstanceStatus.RUNNING
    return InstanceInfo(
        provider=Provider.AWS,
        provider_instance_id=str(raw["InstanceId"]),
        machine_id=tags.get(MACHINE_LABEL, ""),
        status=status,
        labels=tags,
        launch_time=created_at(raw),
        region=region,
        zone=str((raw.get("Placement") or {}).get("AvailabilityZone", "")),
        instance_type=str(raw.get("InstanceType", "")),
        capacity_type=CapacityType.SPOT if raw.get("InstanceLifecycle") == "spot" else CapacityType.ON_DEMAND,
        agent_address=f"{address}:{agent_port}" if running and address else "",
        # EC2 says why an instance stopped: a halt from inside is the machine's own doing.
        stopped_by_itself=status is InstanceStatus.STOPPED
        and (raw.get("StateReason") or {}).get("Code") == "Client.InstanceInitiatedShutdown",
    )


def moved(info: InstanceInfo, changes: Sequence[Mapping[str, Any]]) -> InstanceInfo:
    """``info`` after a start or stop, in the state EC2 answered with (StartingInstances /
    StoppingInstances); the agent's address is unknown again until it is running."""
    for change in changes:
        if change.get("InstanceId") == info.provider_instance_id:
            status = _STATUS.get(str((change.get("CurrentState") or {}).get("Name", "")))
            if status is not None and status is not info.status:
                return replace(info, status=status, agent_address="")
    return info
