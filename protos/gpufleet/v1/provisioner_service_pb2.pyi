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

class ProviderErrorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROVIDER_ERROR_KIND_UNSPECIFIED: _ClassVar[ProviderErrorKind]
    PROVIDER_ERROR_KIND_NOT_FOUND: _ClassVar[ProviderErrorKind]
    PROVIDER_ERROR_KIND_INSUFFICIENT_CAPACITY: _ClassVar[ProviderErrorKind]
    PROVIDER_ERROR_KIND_QUOTA_EXCEEDED: _ClassVar[ProviderErrorKind]
    PROVIDER_ERROR_KIND_AUTH_FAILED: _ClassVar[ProviderErrorKind]
    PROVIDER_ERROR_KIND_TRANSIENT: _ClassVar[ProviderErrorKind]
    PROVIDER_ERROR_KIND_NOT_YET_DONE: _ClassVar[ProviderErrorKind]

class InstanceStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSTANCE_STATUS_UNSPECIFIED: _ClassVar[InstanceStatus]
    INSTANCE_STATUS_PENDING: _ClassVar[InstanceStatus]
    INSTANCE_STATUS_RUNNING: _ClassVar[InstanceStatus]
    INSTANCE_STATUS_STOPPING: _ClassVar[InstanceStatus]
    INSTANCE_STATUS_STOPPED: _ClassVar[InstanceStatus]
    INSTANCE_STATUS_TERMINATED: _ClassVar[InstanceStatus]
PROVIDER_ERROR_KIND_UNSPECIFIED: ProviderErrorKind
PROVIDER_ERROR_KIND_NOT_FOUND: ProviderErrorKind
PROVIDER_ERROR_KIND_INSUFFICIENT_CAPACITY: ProviderErrorKind
PROVIDER_ERROR_KIND_QUOTA_EXCEEDED: ProviderErrorKind
PROVIDER_ERROR_KIND_AUTH_FAILED: ProviderErrorKind
PROVIDER_ERROR_KIND_TRANSIENT: ProviderErrorKind
PROVIDER_ERROR_KIND_NOT_YET_DONE: ProviderErrorKind
INSTANCE_STATUS_UNSPECIFIED: InstanceStatus
INSTANCE_STATUS_PENDING: InstanceStatus
INSTANCE_STATUS_RUNNING: InstanceStatus
INSTANCE_STATUS_STOPPING: InstanceStatus
INSTANCE_STATUS_STOPPED: InstanceStatus
INSTANCE_STATUS_TERMINATED: InstanceStatus

class Instance(_message.Message):
    __slots__ = ("name", "machine_id", "provider", "provider_instance_id", "region", "zone", "instance_type", "capacity_type", "status", "labels", "launch_time", "agent_address", "stopped_by_itself")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_TIME_FIELD_NUMBER: _ClassVar[int]
    AGENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STOPPED_BY_ITSELF_FIELD_NUMBER: _ClassVar[int]
    name: str
    machine_id: str
    provider: _machine_pb2.Provider
    provider_instance_id: str
    region: str
    zone: str
    instance_type: str
    capacity_type: _machine_pb2.CapacityType
    status: InstanceStatus
    labels: _containers.ScalarMap[str, str]
    launch_time: _timestamp_pb2.Timestamp
    agent_address: str
    stopped_by_itself: bool
    def __init__(self, name: _Optional[str] = ..., machine_id: _Optional[str] = ..., provider: _Optional[_Union[_machine_pb2.Provider, str]] = ..., provider_instance_id: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., instance_type: _Optional[str] = ..., capacity_type: _Optional[_Union[_machine_pb2.CapacityType, str]] = ..., status: _Optional[_Union[InstanceStatus, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., launch_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., agent_address: _Optional[str] = ..., stopped_by_itself: _Optional[bool] = ...) -> None: ...

class CreateInstanceRequest(_message.Message):
    __slots__ = ("request_id", "machine_id", "offering")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFERING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    machine_id: str
    offering: _machine_pb2.Offering
    def __init__(self, request_id: _Optional[str] = ..., machine_id: _Optional[str] = ..., offering: _Optional[_Union[_machine_pb2.Offering, _Mapping]] = ...) -> None: ...

class StartInstanceRequest(_message.Message):
    __slots__ = ("request_id", "machine_id", "offering", "provider_instance_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFERING_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    machine_id: str
    offering: _machine_pb2.Offering
    provider_instance_id: str
    def __init__(self, request_id: _Optional[str] = ..., machine_id: _Optional[str] = ..., offering: _Optional[_Union[_machine_pb2.Offering, _Mapping]] = ..., provider_instance_id: _Optional[str] = ...) -> None: ...

class StopInstanceRequest(_message.Message):
    __slots__ = ("request_id", "machine_id", "offering", "provider_instance_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFERING_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    machine_id: str
    offering: _machine_pb2.Offering
    provider_instance_id: str
    def __init__(self, request_id: _Optional[str] = ..., machine_id: _Optional[str] = ..., offering: _Optional[_Union[_machine_pb2.Offering, _Mapping]] = ..., provider_instance_id: _Optional[str] = ...) -> None: ...

class DestroyInstanceRequest(_message.Message):
    __slots__ = ("request_id", "machine_id", "offering", "provider_instance_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFERING_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    machine_id: str
    offering: _machine_pb2.Offering
    provider_instance_id: str
    def __init__(self, request_id: _Optional[str] = ..., machine_id: _Optional[str] = ..., offering: _Optional[_Union[_machine_pb2.Offering, _Mapping]] = ..., provider_instance_id: _Optional[str] = ...) -> None: ...

class DestroyInstanceResponse(_message.Message):
    __slots__ = ("existed",)
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    def __init__(self, existed: _Optional[bool] = ...) -> None: ...

class GetInstanceRequest(_message.Message):
    __slots__ = ("machine_id", "offering", "provider_instance_id")
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFERING_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    machine_id: str
    offering: _machine_pb2.Offering
    provider_instance_id: str
    def __init__(self, machine_id: _Optional[str] = ..., offering: _Optional[_Union[_machine_pb2.Offering, _Mapping]] = ..., provider_instance_id: _Optional[str] = ...) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "provider")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    provider: _machine_pb2.Provider
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., provider: _Optional[_Union[_machine_pb2.Provider, str]] = ...) -> None: ...

class ListInstancesResponse(_message.Message):
    __slots__ = ("instances", "next_page_token", "unreachable")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[Instance]
    next_page_token: str
    unreachable: _containers.RepeatedScalarFieldContainer[_machine_pb2.Provider]
    def __init__(self, instances: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., unreachable: _Optional[_Iterable[_Union[_machine_pb2.Provider, str]]] = ...) -> None: ...

class ListOfferingsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "pool")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    pool: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class ListOfferingsResponse(_message.Message):
    __slots__ = ("offerings", "next_page_token")
    OFFERINGS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    offerings: _containers.RepeatedCompositeFieldContainer[_machine_pb2.Offering]
    next_page_token: str
    def __init__(self, offerings: _Optional[_Iterable[_Union[_machine_pb2.Offering, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
