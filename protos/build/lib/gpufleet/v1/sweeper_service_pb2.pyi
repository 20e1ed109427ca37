import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from gpufleet.v1 import machine_pb2 as _machine_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SweepKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SWEEP_KIND_UNSPECIFIED: _ClassVar[SweepKind]
    SWEEP_KIND_INVENTORY_RECONCILE: _ClassVar[SweepKind]
    SWEEP_KIND_ORPHAN_SWEEP: _ClassVar[SweepKind]
SWEEP_KIND_UNSPECIFIED: SweepKind
SWEEP_KIND_INVENTORY_RECONCILE: SweepKind
SWEEP_KIND_ORPHAN_SWEEP: SweepKind

class Sweep(_message.Message):
    __slots__ = ("name", "sweep_id", "kind", "start_time", "end_time", "instances_seen", "machines_updated", "orphans_seen", "orphans_destroyed", "unreachable", "summary")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_SEEN_FIELD_NUMBER: _ClassVar[int]
    MACHINES_UPDATED_FIELD_NUMBER: _ClassVar[int]
    ORPHANS_SEEN_FIELD_NUMBER: _ClassVar[int]
    ORPHANS_DESTROYED_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    name: str
    sweep_id: int
    kind: SweepKind
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    instances_seen: int
    machines_updated: int
    orphans_seen: int
    orphans_destroyed: int
    unreachable: _containers.RepeatedScalarFieldContainer[_machine_pb2.Provider]
    summary: str
    def __init__(self, name: _Optional[str] = ..., sweep_id: _Optional[int] = ..., kind: _Optional[_Union[SweepKind, str]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., instances_seen: _Optional[int] = ..., machines_updated: _Optional[int] = ..., orphans_seen: _Optional[int] = ..., orphans_destroyed: _Optional[int] = ..., unreachable: _Optional[_Iterable[_Union[_machine_pb2.Provider, str]]] = ..., summary: _Optional[str] = ...) -> None: ...

class Orphan(_message.Message):
    __slots__ = ("name", "provider", "provider_instance_id", "machine_label", "launch_time", "first_seen_time", "destroy_time", "action")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MACHINE_LABEL_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_TIME_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_TIME_FIELD_NUMBER: _ClassVar[int]
    DESTROY_TIME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    provider: _machine_pb2.Provider
    provider_instance_id: str
    machine_label: str
    launch_time: _timestamp_pb2.Timestamp
    first_seen_time: _timestamp_pb2.Timestamp
    destroy_time: _timestamp_pb2.Timestamp
    action: str
    def __init__(self, name: _Optional[str] = ..., provider: _Optional[_Union[_machine_pb2.Provider, str]] = ..., provider_instance_id: _Optional[str] = ..., machine_label: _Optional[str] = ..., launch_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., first_seen_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., destroy_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., action: _Optional[str] = ...) -> None: ...

class ListSweepsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "kind")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    kind: SweepKind
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., kind: _Optional[_Union[SweepKind, str]] = ...) -> None: ...

class ListSweepsResponse(_message.Message):
    __slots__ = ("sweeps", "next_page_token")
    SWEEPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sweeps: _containers.RepeatedCompositeFieldContainer[Sweep]
    next_page_token: str
    def __init__(self, sweeps: _Optional[_Iterable[_Union[Sweep, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListOrphansRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListOrphansResponse(_message.Message):
    __slots__ = ("orphans", "next_page_token")
    ORPHANS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    orphans: _containers.RepeatedCompositeFieldContainer[Orphan]
    next_page_token: str
    def __init__(self, orphans: _Optional[_Iterable[_Union[Orphan, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RunSweepRequest(_message.Message):
    __slots__ = ("request_id", "kind")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kind: SweepKind
    def __init__(self, request_id: _Optional[str] = ..., kind: _Optional[_Union[SweepKind, str]] = ...) -> None: ...
