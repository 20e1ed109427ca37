import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from gpufleet.v1 import catalog_pb2 as _catalog_pb2
from gpufleet.v1 import machine_pb2 as _machine_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetSystemTimeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SystemTime(_message.Message):
    __slots__ = ("now",)
    NOW_FIELD_NUMBER: _ClassVar[int]
    now: _timestamp_pb2.Timestamp
    def __init__(self, now: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListMachinesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "pool", "state", "include_destroyed")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DESTROYED_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    pool: str
    state: _machine_pb2.MachineState
    include_destroyed: bool
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., pool: _Optional[str] = ..., state: _Optional[_Union[_machine_pb2.MachineState, str]] = ..., include_destroyed: _Optional[bool] = ...) -> None: ...

class ListMachinesResponse(_message.Message):
    __slots__ = ("machines", "next_page_token")
    MACHINES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    machines: _containers.RepeatedCompositeFieldContainer[_machine_pb2.Machine]
    next_page_token: str
    def __init__(self, machines: _Optional[_Iterable[_Union[_machine_pb2.Machine, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetMachineRequest(_message.Message):
    __slots__ = ("machine_id",)
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    def __init__(self, machine_id: _Optional[str] = ...) -> None: ...

class CordonMachineRequest(_message.Message):
    __slots__ = ("machine_id", "request_id")
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    request_id: str
    def __init__(self, machine_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class DeregisterMachineRequest(_message.Message):
    __slots__ = ("machine_id", "request_id")
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    request_id: str
    def __init__(self, machine_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class UncordonMachineRequest(_message.Message):
    __slots__ = ("machine_id", "request_id")
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    request_id: str
    def __init__(self, machine_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools", "next_page_token")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[_catalog_pb2.Pool]
    next_page_token: str
    def __init__(self, pools: _Optional[_Iterable[_Union[_catalog_pb2.Pool, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
