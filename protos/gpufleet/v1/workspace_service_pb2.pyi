import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from gpufleet.v1 import catalog_pb2 as _catalog_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateWorkspaceRequest(_message.Message):
    __slots__ = ("request_id", "workspace", "paused")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    workspace: _catalog_pb2.Workspace
    paused: bool
    def __init__(self, request_id: _Optional[str] = ..., workspace: _Optional[_Union[_catalog_pb2.Workspace, _Mapping]] = ..., paused: _Optional[bool] = ...) -> None: ...

class GetWorkspaceRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class UpdateWorkspaceRequest(_message.Message):
    __slots__ = ("workspace", "update_mask", "request_id")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    workspace: _catalog_pb2.Workspace
    update_mask: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    def __init__(self, workspace: _Optional[_Union[_catalog_pb2.Workspace, _Mapping]] = ..., update_mask: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("workspace_id", "start_time", "end_time")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    def __init__(self, workspace_id: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class UsageFigures(_message.Message):
    __slots__ = ("slot_seconds", "gpu_hours", "charge_micros", "attempts")
    SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_FIELD_NUMBER: _ClassVar[int]
    CHARGE_MICROS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    slot_seconds: float
    gpu_hours: float
    charge_micros: int
    attempts: int
    def __init__(self, slot_seconds: _Optional[float] = ..., gpu_hours: _Optional[float] = ..., charge_micros: _Optional[int] = ..., attempts: _Optional[int] = ...) -> None: ...

class UsageByKind(_message.Message):
    __slots__ = ("kind", "figures")
    KIND_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    figures: UsageFigures
    def __init__(self, kind: _Optional[str] = ..., figures: _Optional[_Union[UsageFigures, _Mapping]] = ...) -> None: ...

class UsageByDay(_message.Message):
    __slots__ = ("day", "figures")
    DAY_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    day: str
    figures: UsageFigures
    def __init__(self, day: _Optional[str] = ..., figures: _Optional[_Union[UsageFigures, _Mapping]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("workspace_id", "start_time", "end_time", "total", "by_kind", "by_day")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    BY_KIND_FIELD_NUMBER: _ClassVar[int]
    BY_DAY_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    total: UsageFigures
    by_kind: _containers.RepeatedCompositeFieldContainer[UsageByKind]
    by_day: _containers.RepeatedCompositeFieldContainer[UsageByDay]
    def __init__(self, workspace_id: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., total: _Optional[_Union[UsageFigures, _Mapping]] = ..., by_kind: _Optional[_Iterable[_Union[UsageByKind, _Mapping]]] = ..., by_day: _Optional[_Iterable[_Union[UsageByDay, _Mapping]]] = ...) -> None: ...
