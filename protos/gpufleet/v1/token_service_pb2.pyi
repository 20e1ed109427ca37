import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOKEN_SCOPE_UNSPECIFIED: _ClassVar[TokenScope]
    TOKEN_SCOPE_MODEL: _ClassVar[TokenScope]
    TOKEN_SCOPE_VOICE: _ClassVar[TokenScope]

class TokenRefusal(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOKEN_REFUSAL_UNSPECIFIED: _ClassVar[TokenRefusal]
    TOKEN_REFUSAL_MALFORMED: _ClassVar[TokenRefusal]
    TOKEN_REFUSAL_UNKNOWN: _ClassVar[TokenRefusal]
    TOKEN_REFUSAL_WRONG_SCOPE: _ClassVar[TokenRefusal]
    TOKEN_REFUSAL_EXPIRED: _ClassVar[TokenRefusal]
    TOKEN_REFUSAL_OVER_CAP: _ClassVar[TokenRefusal]
    TOKEN_REFUSAL_NOT_RUNNING: _ClassVar[TokenRefusal]
TOKEN_SCOPE_UNSPECIFIED: TokenScope
TOKEN_SCOPE_MODEL: TokenScope
TOKEN_SCOPE_VOICE: TokenScope
TOKEN_REFUSAL_UNSPECIFIED: TokenRefusal
TOKEN_REFUSAL_MALFORMED: TokenRefusal
TOKEN_REFUSAL_UNKNOWN: TokenRefusal
TOKEN_REFUSAL_WRONG_SCOPE: TokenRefusal
TOKEN_REFUSAL_EXPIRED: TokenRefusal
TOKEN_REFUSAL_OVER_CAP: TokenRefusal
TOKEN_REFUSAL_NOT_RUNNING: TokenRefusal

class CheckTokenRequest(_message.Message):
    __slots__ = ("token", "scope", "spend_micros")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SPEND_MICROS_FIELD_NUMBER: _ClassVar[int]
    token: str
    scope: TokenScope
    spend_micros: int
    def __init__(self, token: _Optional[str] = ..., scope: _Optional[_Union[TokenScope, str]] = ..., spend_micros: _Optional[int] = ...) -> None: ...

class CheckTokenResponse(_message.Message):
    __slots__ = ("valid", "reason", "workspace", "job_id", "attempt_id", "scope", "spend_cap_micros", "expire_time", "refusal", "remaining_micros")
    VALID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SPEND_CAP_MICROS_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    REMAINING_MICROS_FIELD_NUMBER: _ClassVar[int]
    valid: bool
    reason: str
    workspace: str
    job_id: str
    attempt_id: str
    scope: TokenScope
    spend_cap_micros: int
    expire_time: _timestamp_pb2.Timestamp
    refusal: TokenRefusal
    remaining_micros: int
    def __init__(self, valid: _Optional[bool] = ..., reason: _Optional[str] = ..., workspace: _Optional[str] = ..., job_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., scope: _Optional[_Union[TokenScope, str]] = ..., spend_cap_micros: _Optional[int] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., refusal: _Optional[_Union[TokenRefusal, str]] = ..., remaining_micros: _Optional[int] = ...) -> None: ...
