"""Conversions between store rows and gpufleet.v1 messages, shared so every service
renders a machine, an offering or a time the same way."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.common import gpu_health
from gpufleet.common.db import models
from gpufleet.v1 import machine_pb2


def ts(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    out = Timestamp()
    out.FromDatetime(value.astimezone(UTC))
    return out


def dur(seconds: float) -> Duration:
    out = Duration()
    out.FromTimedelta(timedelta(seconds=seconds))
    return out


def enum_value(enum_type: Any, prefix: str, name: str) -> Any:
    """``enum_value(machine_pb2.MachineState, "MACHINE_STATE_", "READY")`` -> its number.

    Typed ``Any`` because each generated enum has its own ``ValueType``.
    """
    return enum_type.Value(prefix + name)


def enum_name(enum_type: object, prefix: str, number: int) -> str:
    """The stored name for a proto enum number (prefix stripped)."""
    return str(enum_type.Name(number)).removeprefix(prefix)  # type: ignore[attr-defined]


def offering_of_machine(m: models.Machine) -> machine_pb2.Offering:
    """The offering a machine was bought with (its snapshot, not today's catalogue)."""
    return machine_pb2.Offering(
        name=f"offerings/{m.offering_id or ''}",
        offering_id=m.offering_id or "",
        provider=enum_value(machine_pb2.Provider, "PROVIDER_", m.provider),
        region=m.region,
        zone=m.zone,
        instance_type=m.instance_type,
        gpu_model=m.gpu_model,
        gpu_count=m.gpu_count,
        slots=m.slots,
        capacity_type=enum_value(machine_pb2.CapacityType, "CAPACITY_TYPE_", m.capacity_type),
        hourly_price_micros=m.hourly_price_micros,
    )


def offering_to_proto(o: models.Offering) -> machine_pb2.Offering:
    return machine_pb2.Offering(
        name=f"offerings/{o.id}",
        offering_id=o.id,
        provider=enum_value(machine_pb2.Provider, "PROVIDER_", o.provider),
        region=o.region,
        zone=o.zone,
        instance_type=o.instance_type,
        gpu_model=o.gpu_model,
        gpu_count=o.gpu_count,
        slots=o.slots,
        capacity_type=enum_value(machine_pb2.CapacityType, "CAPACITY_TYPE_", o.capacity_type),
        hourly_price_micros=o.hourly_price_micros,
    )


def composite_liveness(m: models.Machine) -> tuple[datetime | None, str]:
    """The freshest of the three channels: an operator's question, never a reaper's gate."""
    channels = [("PROVIDER", m.provider_seen_at), ("PROBE", m.probe_ok_at), ("WORKER", m.worker_report_at)]
    seen = [(at, name) for name, at in channels if at is not None]
    if not seen:
        return None, "UNSPECIFIED"
    at, name = max(seen)
    return at, name


def machine_to_proto(m: models.Machine, slots_busy: int = 0) -> machine_pb2.Machine:
    composite_at, composite_channel = composite_liveness(m)
    return machine_pb2.Machine(
        name=f"machines/{m.id}",
        machine_id=m.id,
        pool=m.pool_id or "",
        offering=offering_of_machine(m),
        origin=enum_value(machine_pb2.MachineOrigin, "MACHINE_ORIGIN_", m.origin),
        managed=m.managed,
        workload_class=enum_value(machine_pb2.WorkloadClass, "WORKLOAD_CLASS_", m.workload_class),
        state=enum_value(machine_pb2.MachineState, "MACHINE_STATE_", m.state),
        intent=enum_value(machine_pb2.MachineIntent, "MACHINE_INTENT_", m.intent),
        lost=m.lost,
        cordoned=m.cordoned,
        provider_instance_id=m.provider_instance_id or "",
        agent_address=m.agent_address or "",
        liveness=machine_pb2.Liveness(
            provider_seen_at=ts(m.provider_seen_at),
            probe_ok_at=ts(m.probe_ok_at),
            probe_failed_since=ts(m.probe_failed_since),
            worker_report_at=ts(m.worker_report_at),
            composite_at=ts(composite_at),
            composite_channel=enum_value(machine_pb2.LivenessChannel, "LIVENESS_CHANNEL_", composite_channel),
        ),
        idle_timers=machine_pb2.IdleTimers(
            stop_due_at=ts(m.stop_due_at), destroy_due_at=ts(m.destroy_due_at)
        ),
        requested_at=ts(m.requested_at),
        provision_deadline_at=ts(m.provision_deadline_at),
        first_observed_at=ts(m.first_observed_at),
        state_changed_at=ts(m.state_changed_at),
        state_changed_by=m.state_changed_by or "",
        state_reason=m.state_reason or "",
        slots_total=m.slots,
        slots_busy=slots_busy,
        preemption_count=m.preemption_count,
        spot_hours=m.spot_seconds / 3600.0,
        earmarked_for_job=m.earmarked_for or "",
        earmarked_at=ts(m.earmarked_at),
        gpu_health=gpu_health.to_proto(m.gpu_health, m.gpu_findings, m.gpu_health_at),
    )
