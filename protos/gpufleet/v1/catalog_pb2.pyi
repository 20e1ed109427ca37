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

class Pool(_message.Message):
    __slots__ = ("name", "pool_id", "gpu_model", "slots_per_machine", "offerings", "warm_target", "max_machines", "idle_since")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    SLOTS_PER_MACHINE_FIELD_NUMBER: _ClassVar[int]
    OFFERINGS_FIELD_NUMBER: _ClassVar[int]
    WARM_TARGET_FIELD_NUMBER: _ClassVar[int]
    MAX_MACHINES_FIELD_NUMBER: _ClassVar[int]
    IDLE_SINCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    pool_id: str
    gpu_model: str
    slots_per_machine: int
    offerings: _containers.RepeatedCompositeFieldContainer[_machine_pb2.Offering]
    warm_target: int
    max_machines: int
    idle_since: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., pool_id: _Optional[str] = ..., gpu_model: _Optional[str] = ..., slots_per_machine: _Optional[int] = ..., offerings: _Optional[_Iterable[_Union[_machine_pb2.Offering, _Mapping]]] = ..., warm_target: _Optional[int] = ..., max_machines: _Optional[int] = ..., idle_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("name", "plan_id", "tier", "weight", "max_gpu_jobs", "rate_micros")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_GPU_JOBS_FIELD_NUMBER: _ClassVar[int]
    RATE_MICROS_FIELD_NUMBER: _ClassVar[int]
    name: str
    plan_id: str
    tier: int
    weight: float
    max_gpu_jobs: int
    rate_micros: int
    def __init__(self, name: _Optional[str] = ..., plan_id: _Optional[str] = ..., tier: _Optional[int] = ..., weight: _Optional[float] = ..., max_gpu_jobs: _Optional[int] = ..., rate_micros: _Optional[int] = ...) -> None: ...

class Workspace(_message.Message):
    __slots__ = ("name", "workspace_id", "plan", "active")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    name: str
    workspace_id: str
    plan: str
    active: bool
    def __init__(self, name: _Optional[str] = ..., workspace_id: _Optional[str] = ..., plan: _Optional[str] = ..., active: _Optional[bool] = ...) -> None: ...

class JobKind(_message.Message):
    __slots__ = ("name", "kind_id", "slots", "time_limit", "runs_writer_code", "queue_wait_deadline", "retry_budget", "lost_retry_budget", "resumes_from_checkpoint", "memory_limit_bytes", "pids_limit", "default_pool", "default_pipeline_version", "expected_duration")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_ID_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_FIELD_NUMBER: _ClassVar[int]
    RUNS_WRITER_CODE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    RETRY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    LOST_RETRY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    RESUMES_FROM_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIDS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_POOL_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PIPELINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_DURATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind_id: str
    slots: int
    time_limit: _duration_pb2.Duration
    runs_writer_code: bool
    queue_wait_deadline: _duration_pb2.Duration
    retry_budget: int
    lost_retry_budget: int
    resumes_from_checkpoint: bool
    memory_limit_bytes: int
    pids_limit: int
    default_pool: str
    default_pipeline_version: str
    expected_duration: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., kind_id: _Optional[str] = ..., slots: _Optional[int] = ..., time_limit: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., runs_writer_code: _Optional[bool] = ..., queue_wait_deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., retry_budget: _Optional[int] = ..., lost_retry_budget: _Optional[int] = ..., resumes_from_checkpoint: _Optional[bool] = ..., memory_limit_bytes: _Optional[int] = ..., pids_limit: _Optional[int] = ..., default_pool: _Optional[str] = ..., default_pipeline_version: _Optional[str] = ..., expected_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ListWorkspacesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWorkspacesResponse(_message.Message):
    __slots__ = ("workspaces", "next_page_token")
    WORKSPACES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workspaces: _containers.RepeatedCompositeFieldContainer[Workspace]
    next_page_token: str
    def __init__(self, workspaces: _Optional[_Iterable[_Union[Workspace, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
