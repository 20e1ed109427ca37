"""The edge between gpufleet.v1 messages and the drivers' typed dataclasses.

Drivers never see a protobuf message: the servicer validates a request here (naming the
field at fault) and hands the driver plain frozen dataclasses.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.common.catalog import OfferingSpec
from gpufleet.common.violations import AT_ONCE, Violations
from gpufleet.provisioner.drivers.base import CapacityType, InstanceInfo, Offering, Provider
from gpufleet.v1 import machine_pb2, provisioner_service_pb2

# gpufleet.common.convert is not used here: it imports the store's models, and the
# provisioner has no database access at all.


def _ts(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    out = Timestamp()
    out.FromDatetime(value.astimezone(UTC))
    return out


# A machine id is a label value (GCE: lowercase letters, digits, '-' and '_', at most 63)
# and the local driver's folder name, so it is checked here once for every driver.
_MACHINE_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_PROVIDER_INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")
# What a provider names a region, zone, instance type or GPU model with; an offering id is
# the catalogue's. Printable, short, and never a path or a command.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_SLOTS = 64
MAX_GPUS = 16


def provider_of(number: int, field: str, found: Violations = AT_ONCE) -> Provider | None:
    """The Provider for a proto enum number; unset or unknown is bad input (None, with the
    violation in ``found``)."""
    if number == machine_pb2.PROVIDER_UNSPECIFIED:
        found.add(field, "is required", "REQUIRED")
        return None
    try:
        return Provider(str(machine_pb2.Provider.Name(number)).removeprefix("PROVIDER_"))
    except ValueError:
        found.add(field, f"unknown provider {number}", "UNKNOWN_VALUE")
        return None


def provider_number(provider: Provider) -> int:
    return int(machine_pb2.Provider.Value(f"PROVIDER_{provider.value}"))


def machine_id(value: str, found: Violations = AT_ONCE) -> str:
    if not value:
        found.add("machine_id", "is required", "REQUIRED")
    elif not _MACHINE_ID.fullmatch(value):
        found.add(
            "machine_id",
            "must be 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit",
            "INVALID_FORMAT",
        )
    return value


def provider_instance_id(value: str, found: Violations = AT_ONCE) -> str:
    """Optional; when given it must look like an id, never like a path or a command."""
    if value and not _PROVIDER_INSTANCE_ID.fullmatch(value):
        found.add("provider_instance_id", "is not a provider instance id", "INVALID_FORMAT")
    return value


def offering(request: Any, found: Violations = AT_ONCE, *, for_create: bool = False) -> Offering | None:
    """The request's offering; create also needs where and what to buy. None when it is
    missing or names no provider (the violations in ``found``)."""
    if not request.HasField("offering"):
        found.add("offering", "is required", "REQUIRED")
        return None
    msg: Any = request.offering
    provider = provider_of(msg.provider, "offering.provider", found)
    if for_create:
        for name in ("zone", "instance_type"):
            if not getattr(msg, name):
                found.add(f"offering.{name}", "is required to create an instance", "REQUIRED")
        if msg.slots < 1:
            found.add("offering.slots", "must be at least 1", "OUT_OF_RANGE")
    _check_offering(msg, found)
    if provider is None:
        return None
    capacity = (
        CapacityType.SPOT if msg.capacity_type == machine_pb2.CAPACITY_TYPE_SPOT else CapacityType.ON_DEMAND
    )
    return Offering(
        provider=provider,
        region=msg.region,
        zone=msg.zone,
        instance_type=msg.instance_type,
        slots=msg.slots,
        capacity_type=capacity,
        gpu_model=msg.gpu_model,
        gpu_count=msg.gpu_count,
        hourly_price_micros=msg.hourly_price_micros,
        offering_id=msg.offering_id,
    )


def _check_offering(msg: Any, found: Violations) -> None:
    """Everything an offering carries is stored and shown: check it before any driver."""
    for name in ("region", "zone", "instance_type", "gpu_model", "offering_id"):
        value = getattr(msg, name)
        if value and not _NAME.fullmatch(value):
            found.add(
                f"offering.{name}",
                "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                "INVALID_FORMAT",
            )
    if msg.slots > MAX_SLOTS:
        found.add("offering.slots", f"at most {MAX_SLOTS}", "OUT_OF_RANGE")
    if not 0 <= msg.gpu_count <= MAX_GPUS:
        found.add("offering.gpu_count", f"must be 0 to {MAX_GPUS}", "OUT_OF_RANGE")
    if msg.hourly_price_micros < 0:
        found.add("offering.hourly_price_micros", "must not be negative", "OUT_OF_RANGE")
    if msg.capacity_type not in machine_pb2.CapacityType.values():
        found.add("offering.capacity_type", f"unknown capacity type {msg.capacity_type}", "UNKNOWN_VALUE")


def instance_to_proto(info: InstanceInfo) -> provisioner_service_pb2.Instance:
    return provisioner_service_pb2.Instance(
        name=f"instances/{info.provider.value.lower()}/{info.provider_instance_id}",
        machine_id=info.machine_id,
        provider=f"PROVIDER_{info.provider.value}",
        provider_instance_id=info.provider_instance_id,
        region=info.region,
        zone=info.zone,
        instance_type=info.instance_type,
        capacity_type=f"CAPACITY_TYPE_{info.capacity_type.value}",
        status=f"INSTANCE_STATUS_{info.status.value}",
        labels=dict(info.labels),
        launch_time=_ts(info.launch_time),
        agent_address=info.agent_address,
        stopped_by_itself=info.stopped_by_itself,
    )


def offering_spec_to_proto(spec: OfferingSpec) -> Any:
    """A catalogue offering as the API shows it."""
    return machine_pb2.Offering(
        name=f"offerings/{spec.id}",
        offering_id=spec.id,
        provider=f"PROVIDER_{spec.provider}",
        region=spec.region,
        zone=spec.zone,
        instance_type=spec.instance_type,
        gpu_model=spec.gpu_model,
        gpu_count=spec.gpu_count,
        slots=spec.slots,
        capacity_type=f"CAPACITY_TYPE_{spec.capacity_type}",
        hourly_price_micros=spec.hourly_price_micros,
    )
