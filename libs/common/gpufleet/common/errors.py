"""One root error type for gpufleet, and the one place it maps to gRPC status codes.

Servicers raise these; the server skeleton turns them into statuses carrying the standard
rich error model (:mod:`gpufleet.common.rich_status`): every error an ``ErrorInfo`` with a
stable reason in the ``gpufleet.dev`` domain, bad input a ``BadRequest`` naming each bad
field, an error worth retrying a ``RetryInfo``. Bad input always names the field, so a
client can fix its request without reading server logs — and names every bad field at
once, so it need not learn them one call at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Self

import grpc

# ErrorInfo.domain of every error gpufleet's own code raises: the reasons below are ours.
DOMAIN = "gpufleet.dev"


@dataclass(frozen=True)
class Violation:
    """One thing wrong with a request: the field's path as the request spells it
    (``job.tenant_values['topic']``), what is wrong in words, and a stable reason a
    program can switch on (``REQUIRED``, ``INVALID_FORMAT``, ``TOO_LARGE``...)."""

    field: str
    description: str
    reason: str = "INVALID"


class GpufleetError(Exception):
    """Root of every error gpufleet raises on purpose.

    ``reason`` is the ErrorInfo reason (UPPER_SNAKE_CASE, stable: a program's switch, not
    a person's message); a raise names its own or gets its class's. ``retry_after_s``,
    when set, says a retry after that long may succeed (RetryInfo); unset, retrying the
    same call cannot help."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    # None: the status code's name.
    default_reason: str | None = None
    default_retry_after_s: float | None = None

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        reason: str | None = None,
        violations: Iterable[Violation] = (),
        retry_after_s: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        self.violations = tuple(violations)
        if field and not self.violations:
            self.violations = (Violation(field, message),)
        self.field = field or (self.violations[0].field if self.violations else None)
        self.message = f"{field}: {message}" if field else message
        self.reason = reason or self.default_reason or self.code.name
        self.retry_after_s = retry_after_s if retry_after_s is not None else self.default_retry_after_s
        self.metadata = dict(metadata or {})
        super().__init__(self.message)

    @classmethod
    def of(cls, violations: Iterable[Violation], *, reason: str | None = None) -> Self:
        """One error naming every violation, its message listing them all."""
        found = tuple(violations)
        message = "; ".join(f"{v.field}: {v.description}" for v in found)
        return cls(message, violations=found, reason=reason)


class InvalidArgument(GpufleetError):
    """The request is malformed; ``field`` (or each of ``violations``) names what to fix."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    default_reason = "INVALID_REQUEST"


class NotFound(GpufleetError):
    code = grpc.StatusCode.NOT_FOUND
    default_reason = "NOT_FOUND"


class FailedPrecondition(GpufleetError):
    """The request is well formed but the resource is in the wrong state for it."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    default_reason = "FAILED_PRECONDITION"


class AlreadyExists(GpufleetError):
    code = grpc.StatusCode.ALREADY_EXISTS
    default_reason = "ALREADY_EXISTS"


class ResourceExhausted(GpufleetError):
    """A limit of ours is reached for now (open streams, a pool); a later retry may pass."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_reason = "RESOURCE_EXHAUSTED"
    default_retry_after_s = 5.0


class Unavailable(GpufleetError):
    """A dependency (database, provider, agent) is down; the caller may retry."""

    code = grpc.StatusCode.UNAVAILABLE
    default_reason = "UNAVAILABLE"
    default_retry_after_s = 1.0


class DatabaseUnavailable(Unavailable):
    """The store cannot be reached or cannot write (a PostgreSQL restart, a failover, a
    standby answering read-only). Retrying the same call once it is back is safe: a write
    cut off before its commit left nothing, and one whose commit's answer was lost is
    found again by its request id (gpufleet.common.db.outage says which errors these are)."""

    default_reason = "DATABASE_UNAVAILABLE"
    default_retry_after_s = 2.0


class DeadlineExceeded(GpufleetError):
    """A call refused because its caller may already have given up on it: acting on it
    late could undo what the caller did next (a start taken back and dispatched again)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
    default_reason = "CALLER_MAY_HAVE_GIVEN_UP"


class PermissionDenied(GpufleetError):
    """The caller is who it says, and may not do this."""

    code = grpc.StatusCode.PERMISSION_DENIED
    default_reason = "PERMISSION_DENIED"


class Unauthenticated(GpufleetError):
    """The caller proved no identity of this deployment."""

    code = grpc.StatusCode.UNAUTHENTICATED
    default_reason = "UNAUTHENTICATED"


class Fenced(GpufleetError):
    """A write from a leader whose epoch is no longer current was refused."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    default_reason = "NOT_LEADER"


# Known failures of libraries the server skeleton must not import itself (the database's
# loss, from SQLAlchemy and psycopg, which the provisioner and the agent do not load): each
# module that knows one registers how to say it (gpufleet.common.db.outage).
Translator = Callable[[BaseException], GpufleetError | None]
_TRANSLATORS: list[Translator] = []


def translate_with(translator: Translator) -> None:
    """Have the server skeleton answer the exceptions ``translator`` recognises as the
    GpufleetError it returns (None: not one it knows)."""
    if translator not in _TRANSLATORS:
        _TRANSLATORS.append(translator)


def translated(error: BaseException) -> GpufleetError | None:
    """The GpufleetError a registered translator makes of ``error``, if any."""
    for translator in _TRANSLATORS:
        known = translator(error)
        if known is not None:
            return known
    return None


# Deprecated: the first bad field as a trailer of its own, from before the rich error
# model. Still sent for one release (older CLIs and clients read it); read the BadRequest
# or ErrorInfo details instead.
FIELD_METADATA_KEY = "gpufleet-field"
