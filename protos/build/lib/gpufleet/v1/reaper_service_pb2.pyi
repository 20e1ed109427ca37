from gpufleet.v1 import ledger_pb2 as _ledger_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListWatchdogsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWatchdogsResponse(_message.Message):
    __slots__ = ("watchdogs", "next_page_token")
    WATCHDOGS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    watchdogs: _containers.RepeatedCompositeFieldContainer[_ledger_pb2.Watchdog]
    next_page_token: str
    def __init__(self, watchdogs: _Optional[_Iterable[_Union[_ledger_pb2.Watchdog, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListLedgerEntriesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "machine_id", "failure_class", "detector")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    DETECTOR_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    machine_id: str
    failure_class: str
    detector: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., machine_id: _Optional[str] = ..., failure_class: _Optional[str] = ..., detector: _Optional[str] = ...) -> None: ...

class ListLedgerEntriesResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_ledger_pb2.LedgerEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[_ledger_pb2.LedgerEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListIncidentsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "state")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    state: _ledger_pb2.IncidentState
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., state: _Optional[_Union[_ledger_pb2.IncidentState, str]] = ...) -> None: ...

class ListIncidentsResponse(_message.Message):
    __slots__ = ("incidents", "next_page_token")
    INCIDENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    incidents: _containers.RepeatedCompositeFieldContainer[_ledger_pb2.Incident]
    next_page_token: str
    def __init__(self, incidents: _Optional[_Iterable[_Union[_ledger_pb2.Incident, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AcknowledgeIncidentRequest(_message.Message):
    __slots__ = ("incident_id", "request_id", "acknowledged_by")
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_BY_FIELD_NUMBER: _ClassVar[int]
    incident_id: int
    request_id: str
    acknowledged_by: str
    def __init__(self, incident_id: _Optional[int] = ..., request_id: _Optional[str] = ..., acknowledged_by: _Optional[str] = ...) -> None: ...

class ListQuarantinesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListQuarantinesResponse(_message.Message):
    __slots__ = ("quarantines", "next_page_token")
    QUARANTINES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    quarantines: _containers.RepeatedCompositeFieldContainer[_ledger_pb2.Quarantine]
    next_page_token: str
    def __init__(self, quarantines: _Optional[_Iterable[_Union[_ledger_pb2.Quarantine, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ClearQuarantineRequest(_message.Message):
    __slots__ = ("quarantine_id", "request_id")
    QUARANTINE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    quarantine_id: int
    request_id: str
    def __init__(self, quarantine_id: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ClearQuarantineResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
