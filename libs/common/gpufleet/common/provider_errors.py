"""Typed provider errors, shared by the provisioner (which raises them from SDK error
codes) and its callers (which get them back from the gRPC status).

They travel as a gRPC status code plus the ``ProviderErrorKind`` name in the trailing
metadata key :data:`METADATA_KEY`, so a caller never parses a message.
"""

from __future__ import annotations

from typing import Any

import grpc

from gpufleet.common.errors import GpufleetError

METADATA_KEY = "gpufleet-provider-error"


class ProviderError(GpufleetError):
    """A provider call failed; ``kind`` is the ProviderErrorKind name without prefix, and
    its ErrorInfo reason."""

    kind = "UNSPECIFIED"
    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        if kwargs.get("reason") is None:
            self.reason = self.kind


class InstanceNotFound(ProviderError):
    """The instance does not exist (destroy treats this as done)."""

    kind = "NOT_FOUND"
    code = grpc.StatusCode.NOT_FOUND


class InsufficientCapacity(ProviderError):
    """A stockout: the zone has no GPUs of this type right now."""

    kind = "INSUFFICIENT_CAPACITY"
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class QuotaExceeded(ProviderError):
    kind = "QUOTA_EXCEEDED"
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class AuthFailed(ProviderError):
    kind = "AUTH_FAILED"
    code = grpc.StatusCode.PERMISSION_DENIED


class Transient(ProviderError):
    """Throttling or a 5xx: worth trying again later."""

    kind = "TRANSIENT"
    code = grpc.StatusCode.UNAVAILABLE


class NotYetDone(ProviderError):
    """A long operation did not finish within its bounded wait; its state is unknown."""

    kind = "NOT_YET_DONE"
    code = grpc.StatusCode.DEADLINE_EXCEEDED


BY_KIND: dict[str, type[ProviderError]] = {
    cls.kind: cls
    for cls in (InstanceNotFound, InsufficientCapacity, QuotaExceeded, AuthFailed, Transient, NotYetDone)
}
