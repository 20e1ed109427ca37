"""One root error type for gpufleet, and the one place it maps to gRPC status codes.

Servicers raise these; the server skeleton turns them into statuses (see
``gpufleet.common.grpcserver``). Bad input always names the field, so a client can fix
its request without reading server logs.
"""

from __future__ import annotations

import grpc


class GpufleetError(Exception):
    """Root of every error gpufleet raises on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        self.message = f"{field}: {message}" if field else message
        super().__init__(self.message)


class InvalidArgument(GpufleetError):
    """The request is malformed; ``field`` names what to fix."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(GpufleetError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(GpufleetError):
    """The request is well formed but the resource is in the wrong state for it."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AlreadyExists(GpufleetError):
    code = grpc.StatusCode.ALREADY_EXISTS


class ResourceExhausted(GpufleetError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(GpufleetError):
    """A dependency (database, provider, agent) is down; the caller may retry."""

    code = grpc.StatusCode.UNAVAILABLE


class PermissionDenied(GpufleetError):
    """The caller is who it says, and may not do this."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(GpufleetError):
    """The caller proved no identity of this deployment."""

    code = grpc.StatusCode.UNAUTHENTICATED


class Fenced(GpufleetError):
    """A write from a leader whose epoch is no longer current was refused."""

    code = grpc.StatusCode.FAILED_PRECONDITION


FIELD_METADATA_KEY = "gpufleet-field"
