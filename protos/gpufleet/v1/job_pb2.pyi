import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_QUEUED: _ClassVar[JobState]
    JOB_STATE_DISPATCHING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]
    JOB_STATE_TIMED_OUT: _ClassVar[JobState]

class AttemptState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_STATE_UNSPECIFIED: _ClassVar[AttemptState]
    ATTEMPT_STATE_STARTING: _ClassVar[AttemptState]
    ATTEMPT_STATE_RUNNING: _ClassVar[AttemptState]
    ATTEMPT_STATE_SUCCEEDED: _ClassVar[AttemptState]
    ATTEMPT_STATE_FAILED: _ClassVar[AttemptState]
    ATTEMPT_STATE_LOST: _ClassVar[AttemptState]
    ATTEMPT_STATE_TIMED_OUT: _ClassVar[AttemptState]
    ATTEMPT_STATE_CANCELLED: _ClassVar[AttemptState]
    ATTEMPT_STATE_INFRA_ERROR: _ClassVar[AttemptState]

class PendingReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PENDING_REASON_UNSPECIFIED: _ClassVar[PendingReason]
    PENDING_REASON_WORKSPACE_PAUSED: _ClassVar[PendingReason]
    PENDING_REASON_PLAN_CONCURRENCY_LIMIT: _ClassVar[PendingReason]
    PENDING_REASON_WAITING_FOR_CAPACITY: _ClassVar[PendingReason]
    PENDING_REASON_POOL_AT_CEILING: _ClassVar[PendingReason]
    PENDING_REASON_OFFERING_QUARANTINED: _ClassVar[PendingReason]
    PENDING_REASON_FILMS_SHARE_CAP: _ClassVar[PendingReason]
    PENDING_REASON_WAITING_FOR_DRAIN: _ClassVar[PendingReason]
    PENDING_REASON_DISPATCH_BACKOFF: _ClassVar[PendingReason]
    PENDING_REASON_QUEUE_WAIT_DEADLINE_NEAR: _ClassVar[PendingReason]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_QUEUED: JobState
JOB_STATE_DISPATCHING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
JOB_STATE_TIMED_OUT: JobState
ATTEMPT_STATE_UNSPECIFIED: AttemptState
ATTEMPT_STATE_STARTING: AttemptState
ATTEMPT_STATE_RUNNING: AttemptState
ATTEMPT_STATE_SUCCEEDED: AttemptState
ATTEMPT_STATE_FAILED: AttemptState
ATTEMPT_STATE_LOST: AttemptState
ATTEMPT_STATE_TIMED_OUT: AttemptState
ATTEMPT_STATE_CANCELLED: AttemptState
ATTEMPT_STATE_INFRA_ERROR: AttemptState
PENDING_REASON_UNSPECIFIED: PendingReason
PENDING_REASON_WORKSPACE_PAUSED: PendingReason
PENDING_REASON_PLAN_CONCURRENCY_LIMIT: PendingReason
PENDING_REASON_WAITING_FOR_CAPACITY: PendingReason
PENDING_REASON_POOL_AT_CEILING: PendingReason
PENDING_REASON_OFFERING_QUARANTINED: PendingReason
PENDING_REASON_FILMS_SHARE_CAP: PendingReason
PENDING_REASON_WAITING_FOR_DRAIN: PendingReason
PENDING_REASON_DISPATCH_BACKOFF: PendingReason
PENDING_REASON_QUEUE_WAIT_DEADLINE_NEAR: PendingReason

class Attempt(_message.Message):
    __slots__ = ("name", "attempt_id", "job_id", "machine_id", "slot", "state", "start_time", "end_time", "lease_expire_time", "slot_seconds", "charged", "charge_micros", "exit_code", "status_message", "started_from")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHARGED_FIELD_NUMBER: _ClassVar[int]
    CHARGE_MICROS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STARTED_FROM_FIELD_NUMBER: _ClassVar[int]
    name: str
    attempt_id: str
    job_id: str
    machine_id: str
    slot: int
    state: AttemptState
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    lease_expire_time: _timestamp_pb2.Timestamp
    slot_seconds: float
    charged: bool
    charge_micros: int
    exit_code: int
    status_message: str
    started_from: Checkpoint
    def __init__(self, name: _Optional[str] = ..., attempt_id: _Optional[str] = ..., job_id: _Optional[str] = ..., machine_id: _Optional[str] = ..., slot: _Optional[int] = ..., state: _Optional[_Union[AttemptState, str]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., slot_seconds: _Optional[float] = ..., charged: _Optional[bool] = ..., charge_micros: _Optional[int] = ..., exit_code: _Optional[int] = ..., status_message: _Optional[str] = ..., started_from: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("checkpoint_id", "job_id", "attempt_id", "sequence", "size_bytes", "sha256", "create_time")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    job_id: str
    attempt_id: str
    sequence: int
    size_bytes: int
    sha256: str
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, checkpoint_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., sequence: _Optional[int] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("name", "job_id", "workspace", "pool", "kind", "pipeline_version", "tenant_values", "request_id", "state", "create_time", "update_time", "start_time", "end_time", "attempt_count", "failure_retries_used", "lost_retries_used", "status_message", "slot_seconds", "charge_micros", "attempts", "pending_reason", "pending_message", "expected_ready_time", "disruptions_used")
    class TenantValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENANT_VALUES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_COUNT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_RETRIES_USED_FIELD_NUMBER: _ClassVar[int]
    LOST_RETRIES_USED_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHARGE_MICROS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_REASON_FIELD_NUMBER: _ClassVar[int]
    PENDING_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_READY_TIME_FIELD_NUMBER: _ClassVar[int]
    DISRUPTIONS_USED_FIELD_NUMBER: _ClassVar[int]
    name: str
    job_id: str
    workspace: str
    pool: str
    kind: str
    pipeline_version: str
    tenant_values: _containers.ScalarMap[str, str]
    request_id: str
    state: JobState
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    attempt_count: int
    failure_retries_used: int
    lost_retries_used: int
    status_message: str
    slot_seconds: float
    charge_micros: int
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    pending_reason: PendingReason
    pending_message: str
    expected_ready_time: _timestamp_pb2.Timestamp
    disruptions_used: int
    def __init__(self, name: _Optional[str] = ..., job_id: _Optional[str] = ..., workspace: _Optional[str] = ..., pool: _Optional[str] = ..., kind: _Optional[str] = ..., pipeline_version: _Optional[str] = ..., tenant_values: _Optional[_Mapping[str, str]] = ..., request_id: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempt_count: _Optional[int] = ..., failure_retries_used: _Optional[int] = ..., lost_retries_used: _Optional[int] = ..., status_message: _Optional[str] = ..., slot_seconds: _Optional[float] = ..., charge_micros: _Optional[int] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., pending_reason: _Optional[_Union[PendingReason, str]] = ..., pending_message: _Optional[str] = ..., expected_ready_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., disruptions_used: _Optional[int] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job", "state", "event_time", "message", "sequence")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    job: Job
    state: JobState
    event_time: _timestamp_pb2.Timestamp
    message: str
    sequence: int
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., state: _Optional[_Union[JobState, str]] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., message: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...
