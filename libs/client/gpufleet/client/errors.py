"""Failed calls as typed exceptions, with what the server's rich status says.

The scheduler ends a failed call with the standard rich error model: a ``google.rpc.Status``
in the ``grpc-status-details-bin`` trailer holding an ``ErrorInfo`` (a stable reason in the
``gpufleet.dev`` domain, the first bad field as metadata ``field``), a ``BadRequest`` naming
every bad field of an INVALID_ARGUMENT request at once, and a ``RetryInfo`` where waiting
and calling again may help. This module reads it back with grpcio-status and Google's
common protos only, so a backend needs nothing of the server's code: a program switches on
the exception's class and ``reason``, a person reads ``violations``.

A status whose code disagrees with the call's is ignored (grpcio-status's rule: it may not
describe this failure), and detail types this client does not know are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import MappingProxyType

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

# ErrorInfo.domain of the reasons gpufleet's own code gives.
DOMAIN = "gpufleet.dev"


@dataclass(frozen=True)
class FieldViolation:
    """One bad field of a request: its path as the request spells it
    (``job.tenant_values['topic']``), what is wrong in words, and a stable reason a program
    can switch on (``REQUIRED``, ``INVALID_FORMAT``, ``TOO_LARGE``...)."""

    field: str
    description: str
    reason: str = ""


class GpufleetApiError(Exception):
    """A call the server (or the transport) failed; the root of every error this client
    raises for a call. Subclasses name the status code; ``reason`` is the server's stable
    name for why (``UNKNOWN_WORKSPACE``), empty when the status carried none."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        metadata: Mapping[str, str] | None = None,
        violations: tuple[FieldViolation, ...] = (),
        retry_after: timedelta | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata: Mapping[str, str] = MappingProxyType(dict(metadata or {}))
        self.violations = violations
        self.retry_after = retry_after
        super().__init__(f"{code.name}: {message}")

    @property
    def field(self) -> str | None:
        """The first bad field: the first violation's, else ErrorInfo's ``field``."""
        if self.violations:
            return self.violations[0].field
        return self.metadata.get("field")


class InvalidArgument(GpufleetApiError):
    """The request is malformed: ``violations`` names every bad field at once."""


class NotFound(GpufleetApiError):
    """What the request names does not exist (``field`` says which name)."""


class AlreadyExists(GpufleetApiError):
    """An idempotency key reused with different content, or an id already taken."""


class FailedPrecondition(GpufleetApiError):
    """Well formed, but the resource is in the wrong state for it (a paused workspace, a
    job that already ended otherwise)."""


class PermissionDenied(GpufleetApiError):
    """The certificate is valid and its role may not make this call."""


class Unauthenticated(GpufleetApiError):
    """The server did not accept the certificate as one of its deployment's."""


class ResourceExhausted(GpufleetApiError):
    """A limit is reached for now (open watches); ``retry_after`` says when to try again."""


class Unavailable(GpufleetApiError):
    """The scheduler could not be reached or could not answer now; ``retry_after`` is the
    server's advice when it sent one. Idempotent calls were already retried."""


class DeadlineExceeded(GpufleetApiError):
    """No answer within the call's deadline; the call may or may not have taken effect."""


_BY_CODE: dict[grpc.StatusCode, type[GpufleetApiError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def error_class(code: grpc.StatusCode) -> type[GpufleetApiError]:
    """The exception type a status code is raised as (the root type for the rest)."""
    return _BY_CODE.get(code, GpufleetApiError)


def from_rpc_error(err: grpc.RpcError) -> GpufleetApiError:
    """The typed error for a failed call, sync or asyncio (both carry code, details and
    trailing metadata)."""
    code: grpc.StatusCode = err.code()  # type: ignore[attr-defined]
    message: str = err.details() or code.name  # type: ignore[attr-defined]
    status = _rich_status(err)
    reason = domain = ""
    metadata: dict[str, str] = {}
    violations: list[FieldViolation] = []
    retry_after: timedelta | None = None
    for detail in status.details if status is not None else ():
        # Unpack answers whether the detail is of that type.
        info, bad, retry = (
            error_details_pb2.ErrorInfo(),
            error_details_pb2.BadRequest(),
            error_details_pb2.RetryInfo(),
        )
        if detail.Unpack(info):
            reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        elif detail.Unpack(bad):
            violations += [FieldViolation(v.field, v.description, v.reason) for v in bad.field_violations]
        elif detail.Unpack(retry):
            retry_after = retry.retry_delay.ToTimedelta()
    return error_class(code)(
        code,
        message,
        reason=reason,
        domain=domain,
        metadata=metadata,
        violations=tuple(violations),
        retry_after=retry_after,
    )


def _rich_status(err: grpc.RpcError) -> status_pb2.Status | None:
    try:
        status: status_pb2.Status | None = rpc_status.from_call(err)  # type: ignore[arg-type]
    except ValueError:  # its code or message disagrees with the call's: not about this failure
        return None
    return status
