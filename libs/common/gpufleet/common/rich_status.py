"""The standard rich error model (``google.rpc.Status`` and its details), both ways.

The server skeleton ends a call that raised a :class:`~gpufleet.common.errors.GpufleetError`
with :func:`status_of` (through grpcio-status, so any gRPC client in any language can
decode it the way Google's APIs document): the code and message as before, and in the
``grpc-status-details-bin`` trailer

- an ``ErrorInfo``: a stable ``reason`` in the :data:`~gpufleet.common.errors.DOMAIN`
  domain, and in its metadata the first bad ``field`` when the error names one;
- a ``BadRequest`` for INVALID_ARGUMENT: one field violation for every bad field of the
  request, all of them at once;
- a ``RetryInfo`` when waiting and calling again may help (UNAVAILABLE and
  RESOURCE_EXHAUSTED from our own code).

A client reads them back with :func:`details_of`. The deprecated ``gpufleet-field``
trailer still goes along for one release.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gpufleet.common.errors import DOMAIN, FIELD_METADATA_KEY, GpufleetError, Violation

DETAILS_KEY = "grpc-status-details-bin"


def rpc_status_of(err: GpufleetError) -> status_pb2.Status:
    """The ``google.rpc.Status`` an error ends its call with."""
    status = status_pb2.Status(code=err.code.value[0], message=err.message)
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=DOMAIN, metadata=err.metadata)
    if err.field:
        info.metadata["field"] = err.field
    status.details.add().Pack(info)
    if err.code == grpc.StatusCode.INVALID_ARGUMENT and err.violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=v.field, description=v.description, reason=v.reason
                )
                for v in err.violations
            ]
        )
        status.details.add().Pack(bad)
    if err.retry_after_s is not None and err.code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ):
        delay = duration_pb2.Duration()
        delay.FromTimedelta(timedelta(seconds=err.retry_after_s))
        status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    return status


def status_of(err: GpufleetError) -> grpc.Status:
    """What the skeleton aborts with: grpcio-status's mapping of :func:`rpc_status_of`,
    plus the deprecated ``gpufleet-field`` trailer when a field is named."""
    status = rpc_status.to_status(rpc_status_of(err))
    if not err.field:
        return status
    # Metadata values must be printable ASCII; a field name can carry a client's own text
    # (a map key), so anything else is escaped rather than failing the answer.
    named = err.field.encode("ascii", "backslashreplace").decode("ascii")
    named = "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in named)
    return _Status(status.code, status.details, (*status.trailing_metadata, (FIELD_METADATA_KEY, named)))


@dataclass(frozen=True)
class _Status(grpc.Status):  # type: ignore[misc]
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


@dataclass(frozen=True)
class ErrorDetails:
    """What a client learns from a failed call's rich status (empty when it had none)."""

    reason: str = ""
    domain: str = ""
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)
    violations: tuple[Violation, ...] = ()
    retry_after_s: float | None = None

    @property
    def field(self) -> str | None:
        """The first bad field: the first violation's, else ErrorInfo's ``field``."""
        if self.violations:
            return self.violations[0].field
        return self.metadata.get("field")


def details_of(err: grpc.RpcError) -> ErrorDetails:
    """Decode the ``google.rpc.Status`` a failed call (sync or asyncio) carries in its
    trailers. A status whose code disagrees with the call's is ignored, as grpcio-status
    does; unknown detail types are skipped."""
    status = _rich_status(err)
    if status is None:
        return ErrorDetails()
    reason = domain = ""
    metadata: dict[str, str] = {}
    violations: list[Violation] = []
    retry: float | None = None
    for detail in status.details:
        # Unpack answers whether the detail is of that type.
        info, bad, delay = (
            error_details_pb2.ErrorInfo(),
            error_details_pb2.BadRequest(),
            error_details_pb2.RetryInfo(),
        )
        if detail.Unpack(info):
            reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        elif detail.Unpack(bad):
            violations += [Violation(v.field, v.description, v.reason) for v in bad.field_violations]
        elif detail.Unpack(delay):
            retry = delay.retry_delay.ToTimedelta().total_seconds()
    return ErrorDetails(reason, domain, metadata, tuple(violations), retry)


def _rich_status(err: grpc.RpcError) -> status_pb2.Status | None:
    code = err.code() if callable(getattr(err, "code", None)) else None  # type: ignore[attr-defined]
    for key, value in getattr(err, "trailing_metadata", lambda: ())() or ():
        if key == DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status.FromString(value)
            if code is not None and code.value[0] != status.code:
                return None
            return status
    return None
