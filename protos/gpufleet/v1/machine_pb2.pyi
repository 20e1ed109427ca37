import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Provider(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROVIDER_UNSPECIFIED: _ClassVar[Provider]
    PROVIDER_GCP: _ClassVar[Provider]
    PROVIDER_AWS: _ClassVar[Provider]
    PROVIDER_LOCAL: _ClassVar[Provider]
    PROVIDER_SIM: _ClassVar[Provider]

class CapacityType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CAPACITY_TYPE_UNSPECIFIED: _ClassVar[CapacityType]
    CAPACITY_TYPE_SPOT: _ClassVar[CapacityType]
    CAPACITY_TYPE_ON_DEMAND: _ClassVar[CapacityType]

class MachineState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MACHINE_STATE_UNSPECIFIED: _ClassVar[MachineState]
    MACHINE_STATE_REQUESTED: _ClassVar[MachineState]
    MACHINE_STATE_PROVISIONING: _ClassVar[MachineState]
    MACHINE_STATE_BOOTING: _ClassVar[MachineState]
    MACHINE_STATE_READY: _ClassVar[MachineState]
    MACHINE_STATE_DRAINING: _ClassVar[MachineState]
    MACHINE_STATE_STOPPING: _ClassVar[MachineState]
    MACHINE_STATE_STOPPED: _ClassVar[MachineState]
    MACHINE_STATE_STARTING: _ClassVar[MachineState]
    MACHINE_STATE_DESTROYING: _ClassVar[MachineState]
    MACHINE_STATE_DESTROYED: _ClassVar[MachineState]

class MachineIntent(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MACHINE_INTENT_UNSPECIFIED: _ClassVar[MachineIntent]
    MACHINE_INTENT_RUNNING: _ClassVar[MachineIntent]
    MACHINE_INTENT_STOPPED: _ClassVar[MachineIntent]
    MACHINE_INTENT_DESTROYED: _ClassVar[MachineIntent]

class MachineOrigin(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MACHINE_ORIGIN_UNSPECIFIED: _ClassVar[MachineOrigin]
    MACHINE_ORIGIN_PROVISIONED: _ClassVar[MachineOrigin]
    MACHINE_ORIGIN_REGISTERED: _ClassVar[MachineOrigin]

class WorkloadClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKLOAD_CLASS_UNSPECIFIED: _ClassVar[WorkloadClass]
    WORKLOAD_CLASS_REPORTING: _ClassVar[WorkloadClass]
    WORKLOAD_CLASS_SILENT: _ClassVar[WorkloadClass]

class LivenessChannel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIVENESS_CHANNEL_UNSPECIFIED: _ClassVar[LivenessChannel]
    LIVENESS_CHANNEL_PROVIDER: _ClassVar[LivenessChannel]
    LIVENESS_CHANNEL_PROBE: _ClassVar[LivenessChannel]
    LIVENESS_CHANNEL_WORKER: _ClassVar[LivenessChannel]

class GpuHealthState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_HEALTH_STATE_UNSPECIFIED: _ClassVar[GpuHealthState]
    GPU_HEALTH_STATE_UNMONITORED: _ClassVar[GpuHealthState]
    GPU_HEALTH_STATE_OK: _ClassVar[GpuHealthState]
    GPU_HEALTH_STATE_WARNING: _ClassVar[GpuHealthState]
    GPU_HEALTH_STATE_CRITICAL: _ClassVar[GpuHealthState]

class GpuFindingSeverity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_FINDING_SEVERITY_UNSPECIFIED: _ClassVar[GpuFindingSeverity]
    GPU_FINDING_SEVERITY_WARNING: _ClassVar[GpuFindingSeverity]
    GPU_FINDING_SEVERITY_CRITICAL: _ClassVar[GpuFindingSeverity]
PROVIDER_UNSPECIFIED: Provider
PROVIDER_GCP: Provider
PROVIDER_AWS: Provider
PROVIDER_LOCAL: Provider
PROVIDER_SIM: Provider
CAPACITY_TYPE_UNSPECIFIED: CapacityType
CAPACITY_TYPE_SPOT: CapacityType
CAPACITY_TYPE_ON_DEMAND: CapacityType
MACHINE_STATE_UNSPECIFIED: MachineState
MACHINE_STATE_REQUESTED: MachineState
MACHINE_STATE_PROVISIONING: MachineState
MACHINE_STATE_BOOTING: MachineState
MACHINE_STATE_READY: MachineState
MACHINE_STATE_DRAINING: MachineState
MACHINE_STATE_STOPPING: MachineState
MACHINE_STATE_STOPPED: MachineState
MACHINE_STATE_STARTING: MachineState
MACHINE_STATE_DESTROYING: MachineState
MACHINE_STATE_DESTROYED: MachineState
MACHINE_INTENT_UNSPECIFIED: MachineIntent
MACHINE_INTENT_RUNNING: MachineIntent
MACHINE_INTENT_STOPPED: MachineIntent
MACHINE_INTENT_DESTROYED: MachineIntent
MACHINE_ORIGIN_UNSPECIFIED: MachineOrigin
MACHINE_ORIGIN_PROVISIONED: MachineOrigin
MACHINE_ORIGIN_REGISTERED: MachineOrigin
WORKLOAD_CLASS_UNSPECIFIED: WorkloadClass
WORKLOAD_CLASS_REPORTING: WorkloadClass
WORKLOAD_CLASS_SILENT: WorkloadClass
LIVENESS_CHANNEL_UNSPECIFIED: LivenessChannel
LIVENESS_CHANNEL_PROVIDER: LivenessChannel
LIVENESS_CHANNEL_PROBE: LivenessChannel
LIVENESS_CHANNEL_WORKER: LivenessChannel
GPU_HEALTH_STATE_UNSPECIFIED: GpuHealthState
GPU_HEALTH_STATE_UNMONITORED: GpuHealthState
GPU_HEALTH_STATE_OK: GpuHealthState
GPU_HEALTH_STATE_WARNING: GpuHealthState
GPU_HEALTH_STATE_CRITICAL: GpuHealthState
GPU_FINDING_SEVERITY_UNSPECIFIED: GpuFindingSeverity
GPU_FINDING_SEVERITY_WARNING: GpuFindingSeverity
GPU_FINDING_SEVERITY_CRITICAL: GpuFindingSeverity

class GpuFinding(_message.Message):
    __slots__ = ("kind", "severity", "gpu_index", "code", "message", "first_seen_time", "count")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_TIME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    severity: GpuFindingSeverity
    gpu_index: int
    code: int
    message: str
    first_seen_time: _timestamp_pb2.Timestamp
    count: int
    def __init__(self, kind: _Optional[str] = ..., severity: _Optional[_Union[GpuFindingSeverity, str]] = ..., gpu_index: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., first_seen_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., count: _Optional[int] = ...) -> None: ...

class GpuHealth(_message.Message):
    __slots__ = ("state", "findings", "read_time")
    STATE_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    READ_TIME_FIELD_NUMBER: _ClassVar[int]
    state: GpuHealthState
    findings: _containers.RepeatedCompositeFieldContainer[GpuFinding]
    read_time: _timestamp_pb2.Timestamp
    def __init__(self, state: _Optional[_Union[GpuHealthState, str]] = ..., findings: _Optional[_Iterable[_Union[GpuFinding, _Mapping]]] = ..., read_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Offering(_message.Message):
    __slots__ = ("name", "offering_id", "provider", "region", "zone", "instance_type", "gpu_model", "gpu_count", "slots", "capacity_type", "hourly_price_micros")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFERING_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    HOURLY_PRICE_MICROS_FIELD_NUMBER: _ClassVar[int]
    name: str
    offering_id: str
    provider: Provider
    region: str
    zone: str
    instance_type: str
    gpu_model: str
    gpu_count: int
    slots: int
    capacity_type: CapacityType
    hourly_price_micros: int
    def __init__(self, name: _Optional[str] = ..., offering_id: _Optional[str] = ..., provider: _Optional[_Union[Provider, str]] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., instance_type: _Optional[str] = ..., gpu_model: _Optional[str] = ..., gpu_count: _Optional[int] = ..., slots: _Optional[int] = ..., capacity_type: _Optional[_Union[CapacityType, str]] = ..., hourly_price_micros: _Optional[int] = ...) -> None: ...

class Liveness(_message.Message):
    __slots__ = ("provider_seen_at", "probe_ok_at", "probe_failed_since", "worker_report_at", "composite_at", "composite_channel")
    PROVIDER_SEEN_AT_FIELD_NUMBER: _ClassVar[int]
    PROBE_OK_AT_FIELD_NUMBER: _ClassVar[int]
    PROBE_FAILED_SINCE_FIELD_NUMBER: _ClassVar[int]
    WORKER_REPORT_AT_FIELD_NUMBER: _ClassVar[int]
    COMPOSITE_AT_FIELD_NUMBER: _ClassVar[int]
    COMPOSITE_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    provider_seen_at: _timestamp_pb2.Timestamp
    probe_ok_at: _timestamp_pb2.Timestamp
    probe_failed_since: _timestamp_pb2.Timestamp
    worker_report_at: _timestamp_pb2.Timestamp
    composite_at: _timestamp_pb2.Timestamp
    composite_channel: LivenessChannel
    def __init__(self, provider_seen_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., probe_ok_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., probe_failed_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., worker_report_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., composite_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., composite_channel: _Optional[_Union[LivenessChannel, str]] = ...) -> None: ...

class IdleTimers(_message.Message):
    __slots__ = ("stop_due_at", "destroy_due_at")
    STOP_DUE_AT_FIELD_NUMBER: _ClassVar[int]
    DESTROY_DUE_AT_FIELD_NUMBER: _ClassVar[int]
    stop_due_at: _timestamp_pb2.Timestamp
    destroy_due_at: _timestamp_pb2.Timestamp
    def __init__(self, stop_due_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., destroy_due_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Machine(_message.Message):
    __slots__ = ("name", "machine_id", "pool", "offering", "origin", "managed", "workload_class", "state", "intent", "lost", "cordoned", "provider_instance_id", "agent_address", "liveness", "idle_timers", "requested_at", "provision_deadline_at", "first_observed_at", "state_changed_at", "slots_total", "slots_busy", "preemption_count", "spot_hours", "state_changed_by", "state_reason", "earmarked_for_job", "earmarked_at", "gpu_health")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    OFFERING_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    MANAGED_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMERS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    PROVISION_DEADLINE_AT_FIELD_NUMBER: _ClassVar[int]
    FIRST_OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    SLOTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SLOTS_BUSY_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_COUNT_FIELD_NUMBER: _ClassVar[int]
    SPOT_HOURS_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGED_BY_FIELD_NUMBER: _ClassVar[int]
    STATE_REASON_FIELD_NUMBER: _ClassVar[int]
    EARMARKED_FOR_JOB_FIELD_NUMBER: _ClassVar[int]
    EARMARKED_AT_FIELD_NUMBER: _ClassVar[int]
    GPU_HEALTH_FIELD_NUMBER: _ClassVar[int]
    name: str
    machine_id: str
    pool: str
    offering: Offering
    origin: MachineOrigin
    managed: bool
    workload_class: WorkloadClass
    state: MachineState
    intent: MachineIntent
    lost: bool
    cordoned: bool
    provider_instance_id: str
    agent_address: str
    liveness: Liveness
    idle_timers: IdleTimers
    requested_at: _timestamp_pb2.Timestamp
    provision_deadline_at: _timestamp_pb2.Timestamp
    first_observed_at: _timestamp_pb2.Timestamp
    state_changed_at: _timestamp_pb2.Timestamp
    slots_total: int
    slots_busy: int
    preemption_count: int
    spot_hours: float
    state_changed_by: str
    state_reason: str
    earmarked_for_job: str
    earmarked_at: _timestamp_pb2.Timestamp
    gpu_health: GpuHealth
    def __init__(self, name: _Optional[str] = ..., machine_id: _Optional[str] = ..., pool: _Optional[str] = ..., offering: _Optional[_Union[Offering, _Mapping]] = ..., origin: _Optional[_Union[MachineOrigin, str]] = ..., managed: _Optional[bool] = ..., workload_class: _Optional[_Union[WorkloadClass, str]] = ..., state: _Optional[_Union[MachineState, str]] = ..., intent: _Optional[_Union[MachineIntent, str]] = ..., lost: _Optional[bool] = ..., cordoned: _Optional[bool] = ..., provider_instance_id: _Optional[str] = ..., agent_address: _Optional[str] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ..., idle_timers: _Optional[_Union[IdleTimers, _Mapping]] = ..., requested_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., provision_deadline_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., first_observed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state_changed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., slots_total: _Optional[int] = ..., slots_busy: _Optional[int] = ..., preemption_count: _Optional[int] = ..., spot_hours: _Optional[float] = ..., state_changed_by: _Optional[str] = ..., state_reason: _Optional[str] = ..., earmarked_for_job: _Optional[str] = ..., earmarked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., gpu_health: _Optional[_Union[GpuHealth, _Mapping]] = ...) -> None: ...
