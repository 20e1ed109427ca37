from gpufleet.v1 import catalog_pb2 as _catalog_pb2
from gpufleet.v1 import fleet_service_pb2 as _fleet_service_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListJobKindsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobKindsResponse(_message.Message):
    __slots__ = ("job_kinds", "next_page_token")
    JOB_KINDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_kinds: _containers.RepeatedCompositeFieldContainer[_catalog_pb2.JobKind]
    next_page_token: str
    def __init__(self, job_kinds: _Optional[_Iterable[_Union[_catalog_pb2.JobKind, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListPlansRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPlansResponse(_message.Message):
    __slots__ = ("plans", "next_page_token")
    PLANS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedCompositeFieldContainer[_catalog_pb2.Plan]
    next_page_token: str
    def __init__(self, plans: _Optional[_Iterable[_Union[_catalog_pb2.Plan, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
