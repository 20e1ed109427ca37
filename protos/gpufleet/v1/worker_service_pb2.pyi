import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from gpufleet.v1 import job_pb2 as _job_pb2
from gpufleet.v1 import machine_pb2 as _machine_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutCheckpointPartRequest(_message.Message):
    __slots__ = ("machine_id", "attempt_id", "upload_id", "offset", "data")
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    attempt_id: str
    upload_id: str
    offset: int
    data: bytes
    def __init__(self, machine_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., upload_id: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PutCheckpointPartResponse(_message.Message):
    __slots__ = ("received_bytes",)
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    received_bytes: int
    def __init__(self, received_bytes: _Optional[int] = ...) -> None: ...

class CommitCheckpointRequest(_message.Message):
    __slots__ = ("machine_id", "attempt_id", "upload_id", "size_bytes", "sha256")
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    attempt_id: str
    upload_id: str
    size_bytes: int
    sha256: str
    def __init__(self, machine_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., upload_id: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class ReadCheckpointRequest(_message.Message):
    __slots__ = ("machine_id", "attempt_id", "checkpoint_id", "offset", "max_bytes")
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    attempt_id: str
    checkpoint_id: str
    offset: int
    max_bytes: int
    def __init__(self, machine_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadCheckpointResponse(_message.Message):
    __slots__ = ("data", "eof")
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    eof: bool
    def __init__(self, data: _Optional[bytes] = ..., eof: _Optional[bool] = ...) -> None: ...

class RunningAttempt(_message.Message):
    __slots__ = ("attempt_id", "slot")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    slot: int
    def __init__(self, attempt_id: _Optional[str] = ..., slot: _Optional[int] = ...) -> None: ...

class ReportHeartbeatRequest(_message.Message):
    __slots__ = ("machine_id", "running", "report_time", "gpu_health")
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    REPORT_TIME_FIELD_NUMBER: _ClassVar[int]
    GPU_HEALTH_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    running: _containers.RepeatedCompositeFieldContainer[RunningAttempt]
    report_time: _timestamp_pb2.Timestamp
    gpu_health: _machine_pb2.GpuHealth
    def __init__(self, machine_id: _Optional[str] = ..., running: _Optional[_Iterable[_Union[RunningAttempt, _Mapping]]] = ..., report_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., gpu_health: _Optional[_Union[_machine_pb2.GpuHealth, _Mapping]] = ...) -> None: ...

class ReportHeartbeatResponse(_message.Message):
    __slots__ = ("lease_expire_time", "cancel_attempt_ids", "lease_s")
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    CANCEL_ATTEMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    lease_expire_time: _timestamp_pb2.Timestamp
    cancel_attempt_ids: _containers.RepeatedScalarFieldContainer[str]
    lease_s: float
    def __init__(self, lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_attempt_ids: _Optional[_Iterable[str]] = ..., lease_s: _Optional[float] = ...) -> None: ...

class ReportCompletionRequest(_message.Message):
    __slots__ = ("machine_id", "attempt_id", "outcome", "exit_code", "slot_seconds", "message", "slot_not_closed", "disrupted")
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SLOT_NOT_CLOSED_FIELD_NUMBER: _ClassVar[int]
    DISRUPTED_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    attempt_id: str
    outcome: _job_pb2.AttemptState
    exit_code: int
    slot_seconds: float
    message: str
    slot_not_closed: bool
    disrupted: bool
    def __init__(self, machine_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., outcome: _Optional[_Union[_job_pb2.AttemptState, str]] = ..., exit_code: _Optional[int] = ..., slot_seconds: _Optional[float] = ..., message: _Optional[str] = ..., slot_not_closed: _Optional[bool] = ..., disrupted: _Optional[bool] = ...) -> None: ...

class ReportCompletionResponse(_message.Message):
    __slots__ = ("attempt",)
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    attempt: _job_pb2.Attempt
    def __init__(self, attempt: _Optional[_Union[_job_pb2.Attempt, _Mapping]] = ...) -> None: ...

class RegisterMachineRequest(_message.Message):
    __slots__ = ("request_id", "machine_id", "agent_address", "pool", "slots", "workload_class")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    machine_id: str
    agent_address: str
    pool: str
    slots: int
    workload_class: _machine_pb2.WorkloadClass
    def __init__(self, request_id: _Optional[str] = ..., machine_id: _Optional[str] = ..., agent_address: _Optional[str] = ..., pool: _Optional[str] = ..., slots: _Optional[int] = ..., workload_class: _Optional[_Union[_machine_pb2.WorkloadClass, str]] = ...) -> None: ...
