import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from gpufleet.v1 import machine_pb2 as _machine_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProbeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProbeResponse(_message.Message):
    __slots__ = ("machine_id", "agent_version", "worker_alive", "startup_complete", "startup_error", "slots", "sampler", "gpu_health")
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ALIVE_FIELD_NUMBER: _ClassVar[int]
    STARTUP_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    STARTUP_ERROR_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    GPU_HEALTH_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    agent_version: str
    worker_alive: bool
    startup_complete: bool
    startup_error: str
    slots: int
    sampler: str
    gpu_health: _machine_pb2.GpuHealth
    def __init__(self, machine_id: _Optional[str] = ..., agent_version: _Optional[str] = ..., worker_alive: _Optional[bool] = ..., startup_complete: _Optional[bool] = ..., startup_error: _Optional[str] = ..., slots: _Optional[int] = ..., sampler: _Optional[str] = ..., gpu_health: _Optional[_Union[_machine_pb2.GpuHealth, _Mapping]] = ...) -> None: ...

class SampleUtilizationRequest(_message.Message):
    __slots__ = ("window",)
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    window: _duration_pb2.Duration
    def __init__(self, window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SampleUtilizationResponse(_message.Message):
    __slots__ = ("gpu_utilization_percent", "running_attempts", "requests_since_last_sample", "sampler", "sample_time", "encoder_utilization_percent", "decoder_utilization_percent", "memory_utilization_percent")
    GPU_UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RUNNING_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_SINCE_LAST_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_TIME_FIELD_NUMBER: _ClassVar[int]
    ENCODER_UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    DECODER_UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    gpu_utilization_percent: float
    running_attempts: int
    requests_since_last_sample: int
    sampler: str
    sample_time: _timestamp_pb2.Timestamp
    encoder_utilization_percent: float
    decoder_utilization_percent: float
    memory_utilization_percent: float
    def __init__(self, gpu_utilization_percent: _Optional[float] = ..., running_attempts: _Optional[int] = ..., requests_since_last_sample: _Optional[int] = ..., sampler: _Optional[str] = ..., sample_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., encoder_utilization_percent: _Optional[float] = ..., decoder_utilization_percent: _Optional[float] = ..., memory_utilization_percent: _Optional[float] = ...) -> None: ...

class AgentServiceStartJobRequest(_message.Message):
    __slots__ = ("request_id", "attempt_id", "job_id", "slot", "kind", "pipeline_version", "tenant_values", "time_limit", "workspace", "slots", "outbound_network", "memory_limit_bytes", "pids_limit", "keeps_checkpoint", "checkpoint_id", "checkpoint_sha256", "checkpoint_size_bytes", "tokens")
    class TenantValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class TokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENANT_VALUES_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    OUTBOUND_NETWORK_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIDS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    KEEPS_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SHA256_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    attempt_id: str
    job_id: str
    slot: int
    kind: str
    pipeline_version: str
    tenant_values: _containers.ScalarMap[str, str]
    time_limit: _duration_pb2.Duration
    workspace: str
    slots: int
    outbound_network: bool
    memory_limit_bytes: int
    pids_limit: int
    keeps_checkpoint: bool
    checkpoint_id: str
    checkpoint_sha256: str
    checkpoint_size_bytes: int
    tokens: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., job_id: _Optional[str] = ..., slot: _Optional[int] = ..., kind: _Optional[str] = ..., pipeline_version: _Optional[str] = ..., tenant_values: _Optional[_Mapping[str, str]] = ..., time_limit: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., workspace: _Optional[str] = ..., slots: _Optional[int] = ..., outbound_network: _Optional[bool] = ..., memory_limit_bytes: _Optional[int] = ..., pids_limit: _Optional[int] = ..., keeps_checkpoint: _Optional[bool] = ..., checkpoint_id: _Optional[str] = ..., checkpoint_sha256: _Optional[str] = ..., checkpoint_size_bytes: _Optional[int] = ..., tokens: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AgentServiceStartJobResponse(_message.Message):
    __slots__ = ("already_running",)
    ALREADY_RUNNING_FIELD_NUMBER: _ClassVar[int]
    already_running: bool
    def __init__(self, already_running: _Optional[bool] = ...) -> None: ...

class StartJobsRequest(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[AgentServiceStartJobRequest]
    def __init__(self, jobs: _Optional[_Iterable[_Union[AgentServiceStartJobRequest, _Mapping]]] = ...) -> None: ...

class StartJobResult(_message.Message):
    __slots__ = ("attempt_id", "already_running", "code", "message")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    ALREADY_RUNNING_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    already_running: bool
    code: int
    message: str
    def __init__(self, attempt_id: _Optional[str] = ..., already_running: _Optional[bool] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class StartJobsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[StartJobResult]
    def __init__(self, results: _Optional[_Iterable[_Union[StartJobResult, _Mapping]]] = ...) -> None: ...

class AgentServiceCancelJobRequest(_message.Message):
    __slots__ = ("attempt_id", "reason")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    reason: str
    def __init__(self, attempt_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class AgentServiceCancelJobResponse(_message.Message):
    __slots__ = ("was_running",)
    WAS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    was_running: bool
    def __init__(self, was_running: _Optional[bool] = ...) -> None: ...

class Runner(_message.Message):
    __slots__ = ("attempt_id", "job_id", "slot", "pid", "start_time")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    job_id: str
    slot: int
    pid: int
    start_time: _timestamp_pb2.Timestamp
    def __init__(self, attempt_id: _Optional[str] = ..., job_id: _Optional[str] = ..., slot: _Optional[int] = ..., pid: _Optional[int] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListRunnersRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunnersResponse(_message.Message):
    __slots__ = ("runners", "next_page_token")
    RUNNERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runners: _containers.RepeatedCompositeFieldContainer[Runner]
    next_page_token: str
    def __init__(self, runners: _Optional[_Iterable[_Union[Runner, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReadJobLogRequest(_message.Message):
    __slots__ = ("attempt_id", "offset", "max_bytes")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    offset: int
    max_bytes: int
    def __init__(self, attempt_id: _Optional[str] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadJobLogResponse(_message.Message):
    __slots__ = ("data", "end_of_log")
    DATA_FIELD_NUMBER: _ClassVar[int]
    END_OF_LOG_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    end_of_log: bool
    def __init__(self, data: _Optional[bytes] = ..., end_of_log: _Optional[bool] = ...) -> None: ...
