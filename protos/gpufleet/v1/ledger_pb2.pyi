import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LedgerOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEDGER_OUTCOME_UNSPECIFIED: _ClassVar[LedgerOutcome]
    LEDGER_OUTCOME_NOTHING: _ClassVar[LedgerOutcome]
    LEDGER_OUTCOME_RETRY_SAME_MACHINE: _ClassVar[LedgerOutcome]
    LEDGER_OUTCOME_FAIL_JOB: _ClassVar[LedgerOutcome]
    LEDGER_OUTCOME_REPLACE_MACHINE: _ClassVar[LedgerOutcome]
    LEDGER_OUTCOME_STOP_HARDWARE_CONFIG: _ClassVar[LedgerOutcome]
    LEDGER_OUTCOME_HALT_PROVISIONING: _ClassVar[LedgerOutcome]
    LEDGER_OUTCOME_ALERT_HUMAN: _ClassVar[LedgerOutcome]

class IncidentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INCIDENT_STATE_UNSPECIFIED: _ClassVar[IncidentState]
    INCIDENT_STATE_OPEN: _ClassVar[IncidentState]
    INCIDENT_STATE_ACKNOWLEDGED: _ClassVar[IncidentState]
    INCIDENT_STATE_RESOLVED: _ClassVar[IncidentState]

class QuarantineKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUARANTINE_KIND_UNSPECIFIED: _ClassVar[QuarantineKind]
    QUARANTINE_KIND_OFFERING: _ClassVar[QuarantineKind]
    QUARANTINE_KIND_PROVIDER_REGION: _ClassVar[QuarantineKind]
LEDGER_OUTCOME_UNSPECIFIED: LedgerOutcome
LEDGER_OUTCOME_NOTHING: LedgerOutcome
LEDGER_OUTCOME_RETRY_SAME_MACHINE: LedgerOutcome
LEDGER_OUTCOME_FAIL_JOB: LedgerOutcome
LEDGER_OUTCOME_REPLACE_MACHINE: LedgerOutcome
LEDGER_OUTCOME_STOP_HARDWARE_CONFIG: LedgerOutcome
LEDGER_OUTCOME_HALT_PROVISIONING: LedgerOutcome
LEDGER_OUTCOME_ALERT_HUMAN: LedgerOutcome
INCIDENT_STATE_UNSPECIFIED: IncidentState
INCIDENT_STATE_OPEN: IncidentState
INCIDENT_STATE_ACKNOWLEDGED: IncidentState
INCIDENT_STATE_RESOLVED: IncidentState
QUARANTINE_KIND_UNSPECIFIED: QuarantineKind
QUARANTINE_KIND_OFFERING: QuarantineKind
QUARANTINE_KIND_PROVIDER_REGION: QuarantineKind

class LedgerEntry(_message.Message):
    __slots__ = ("name", "entry_id", "create_time", "machine_id", "job_id", "attempt_id", "failure_class", "detector", "details", "outcome")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    DETECTOR_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    name: str
    entry_id: int
    create_time: _timestamp_pb2.Timestamp
    machine_id: str
    job_id: str
    attempt_id: str
    failure_class: str
    detector: str
    details: str
    outcome: LedgerOutcome
    def __init__(self, name: _Optional[str] = ..., entry_id: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., machine_id: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., failure_class: _Optional[str] = ..., detector: _Optional[str] = ..., details: _Optional[str] = ..., outcome: _Optional[_Union[LedgerOutcome, str]] = ...) -> None: ...

class Incident(_message.Message):
    __slots__ = ("name", "incident_id", "create_time", "failure_class", "machine_id", "job_id", "summary", "state", "acknowledge_time", "acknowledged_by", "resolve_time")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGE_TIME_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_BY_FIELD_NUMBER: _ClassVar[int]
    RESOLVE_TIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    incident_id: int
    create_time: _timestamp_pb2.Timestamp
    failure_class: str
    machine_id: str
    job_id: str
    summary: str
    state: IncidentState
    acknowledge_time: _timestamp_pb2.Timestamp
    acknowledged_by: str
    resolve_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., incident_id: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., failure_class: _Optional[str] = ..., machine_id: _Optional[str] = ..., job_id: _Optional[str] = ..., summary: _Optional[str] = ..., state: _Optional[_Union[IncidentState, str]] = ..., acknowledge_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., acknowledged_by: _Optional[str] = ..., resolve_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Watchdog(_message.Message):
    __slots__ = ("name", "watchdog_id", "service", "cadence", "last_run_time", "runs", "actions", "refusals")
    class ActionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class RefusalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    WATCHDOG_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    CADENCE_FIELD_NUMBER: _ClassVar[int]
    LAST_RUN_TIME_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    name: str
    watchdog_id: str
    service: str
    cadence: _duration_pb2.Duration
    last_run_time: _timestamp_pb2.Timestamp
    runs: int
    actions: _containers.ScalarMap[str, int]
    refusals: _containers.ScalarMap[str, int]
    def __init__(self, name: _Optional[str] = ..., watchdog_id: _Optional[str] = ..., service: _Optional[str] = ..., cadence: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., last_run_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., runs: _Optional[int] = ..., actions: _Optional[_Mapping[str, int]] = ..., refusals: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Quarantine(_message.Message):
    __slots__ = ("name", "quarantine_id", "kind", "offering_id", "provider", "region", "reason", "create_time", "expire_time")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUARANTINE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OFFERING_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    quarantine_id: int
    kind: QuarantineKind
    offering_id: str
    provider: str
    region: str
    reason: str
    create_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., quarantine_id: _Optional[int] = ..., kind: _Optional[_Union[QuarantineKind, str]] = ..., offering_id: _Optional[str] = ..., provider: _Optional[str] = ..., region: _Optional[str] = ..., reason: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
