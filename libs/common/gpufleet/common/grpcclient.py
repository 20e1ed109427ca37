"""The client side of every gpufleet call: a deadline on each call, retries only on
idempotent ones, OpenTelemetry propagation and call durations, and transport errors wrapped
into gpufleet's own error types at the boundary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from opentelemetry.instrumentation.grpc import client_interceptor, grpcext

from gpufleet.common import errors
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.rich_status import details_of
from gpufleet.common.rpc_durations import ClientCallDurations
from gpufleet.common.trust.identity import Role
from gpufleet.common.trust.transport import Transport

T = TypeVar("T")

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}

_CODE_TO_ERROR: dict[grpc.StatusCode, type[errors.GpufleetError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.Unavailable,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
}


def open_channel(
    address: str,
    transport: Transport,
    server: Role,
    machine_id: str | None = None,
    *,
    instruments: Instruments = PROCESS,
) -> grpc.Channel:
    """A channel to the part ``server`` at ``address`` (mutual TLS unless the process runs
    insecure for development), with trace propagation and call durations."""
    channel = transport.channel(address, transport.server_name(server, machine_id))
    return intercepted(channel, instruments)


def intercepted(channel: grpc.Channel, instruments: Instruments = PROCESS) -> grpc.Channel:
    """``channel`` with trace propagation and each call's duration recorded (closest to
    the wire, so the span around it covers it)."""
    timed = grpc.intercept_channel(channel, ClientCallDurations(instruments))
    # OpenTelemetry's client interceptor speaks its own interface (grpcext), not grpc's.
    return grpcext.intercept_channel(timed, client_interceptor())  # type: ignore[no-any-return]


def metadata_value(err: grpc.RpcError, key: str) -> str | None:
    for item in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if item.key == key:
            return str(item.value)
    return None


def wrap_rpc_error(err: grpc.RpcError) -> errors.GpufleetError:
    """Translate a transport error into gpufleet's error type, with what its rich status
    says: every bad field, the reason, the retry delay (a server from before the rich
    status: the field from its ``gpufleet-field`` trailer)."""
    code = err.code()  # type: ignore[attr-defined]
    details = err.details() or code.name  # type: ignore[attr-defined]
    cls = _CODE_TO_ERROR.get(code, errors.GpufleetError)
    rich = details_of(err)
    wrapped = cls(
        details,
        violations=rich.violations,
        reason=rich.reason or None,
        retry_after_s=rich.retry_after_s,
        metadata=rich.metadata,
    )
    wrapped.message = details
    wrapped.field = rich.field or metadata_value(err, errors.FIELD_METADATA_KEY)
    wrapped.grpc_code = code  # type: ignore[attr-defined]
    wrapped.rpc_error = err  # type: ignore[attr-defined]
    return wrapped


def transport_failure(err: grpc.RpcError) -> bool:
    """The call may not have reached the server, or its answer was lost."""
    return err.code() in _RETRYABLE  # type: ignore[attr-defined]


# A call's tries (an idempotent one's) and the pause before the second, doubling after.
ATTEMPTS = 3
BACKOFF_S = 0.2


def retry_pause_s(retry: int, backoff: float = BACKOFF_S) -> float:
    """The pause before try ``retry + 2`` (``retry`` counts from 0): doubling."""
    return backoff * 2.0**retry


def unanswered_s(
    timeout: float, *, idempotent: bool, attempts: int = ATTEMPTS, backoff: float = BACKOFF_S
) -> float:
    """How long :func:`call` takes to give up on a server that answers none of its tries
    (each runs to its deadline, DEADLINE_EXCEEDED, and is retried when idempotent): what a
    caller waits on a machine whose path drops its packets. The simulator times a dispatch
    to an unreachable agent by it."""
    tries = attempts if idempotent else 1
    return tries * timeout + sum(retry_pause_s(r, backoff) for r in range(tries - 1))


def call(
    method: Callable[..., T],
    request: Any,
    *,
    timeout: float,
    idempotent: bool,
    attempts: int = ATTEMPTS,
    backoff: float = BACKOFF_S,
    retryable: Callable[[grpc.RpcError], bool] = transport_failure,
    wrap: Callable[[grpc.RpcError], Exception] = wrap_rpc_error,
) -> T:
    """Call ``method`` with a deadline; retry transport failures only when idempotent.

    ``retryable`` narrows what is retried and ``wrap`` turns the final error into the
    caller's own type (the provisioner client's typed provider errors)."""
    tries = attempts if idempotent else 1
    for attempt in range(tries):
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as err:
            if retryable(err) and attempt + 1 < tries:
                time.sleep(retry_pause_s(attempt, backoff))  # real time: transport back-off, not logic
                continue
            raise wrap(err) from err
    raise AssertionError("unreachable")
