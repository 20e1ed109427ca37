"""A failed call's rich status read back into typed errors: every field violation, the
reason and domain, the retry delay — with grpcio-status, as any client would."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2, timestamp_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gpufleet.client import errors


class FailedCall(grpc.RpcError):
    """What grpc raises for a failed call: its code, details and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, object], ...] = ()):
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, object], ...]:
        return self._trailers


def failed(status: status_pb2.Status, code: grpc.StatusCode | None = None) -> FailedCall:
    sent = rpc_status.to_status(status)
    return FailedCall(code or sent.code, sent.details, tuple(sent.trailing_metadata))


def packed(*details: object) -> list[any_pb2.Any]:
    out = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)  # type: ignore[arg-type]
        out.append(holder)
    return out


def test_every_violation_with_reason_and_domain() -> None:
    bad = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field="request_id", description="bad", reason="A"),
            error_details_pb2.BadRequest.FieldViolation(
                field="job.kind", description="is required", reason="B"
            ),
        ]
    )
    info = error_details_pb2.ErrorInfo(
        reason="INVALID_REQUEST", domain="gpufleet.dev", metadata={"field": "x"}
    )
    status = status_pb2.Status(
        code=3, message="request_id: bad; job.kind: is required", details=packed(info, bad)
    )

    error = errors.from_rpc_error(failed(status))

    assert isinstance(error, errors.InvalidArgument)
    assert error.violations == (
        errors.FieldViolation("request_id", "bad", "A"),
        errors.FieldViolation("job.kind", "is required", "B"),
    )
    assert (error.reason, error.domain, dict(error.metadata)) == (
        "INVALID_REQUEST",
        "gpufleet.dev",
        {"field": "x"},
    )
    assert error.field == "request_id"  # the first violation's, ahead of ErrorInfo's
    assert str(error) == "INVALID_ARGUMENT: request_id: bad; job.kind: is required"


def test_retry_info_gives_retry_after() -> None:
    info = error_details_pb2.ErrorInfo(reason="TOO_MANY_WATCHES", domain="gpufleet.dev")
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=5))
    status = status_pb2.Status(code=8, message="too many", details=packed(info, retry))

    error = errors.from_rpc_error(failed(status))

    assert isinstance(error, errors.ResourceExhausted)
    assert (error.reason, error.retry_after, error.violations) == (
        "TOO_MANY_WATCHES",
        timedelta(seconds=5),
        (),
    )


def test_error_info_field_when_no_violation() -> None:
    info = error_details_pb2.ErrorInfo(
        reason="UNKNOWN_WORKSPACE", domain="gpufleet.dev", metadata={"field": "job.workspace"}
    )
    error = errors.from_rpc_error(failed(status_pb2.Status(code=5, message="no", details=packed(info))))
    assert isinstance(error, errors.NotFound)
    assert (error.field, error.reason) == ("job.workspace", "UNKNOWN_WORKSPACE")


def test_a_status_of_another_code_is_not_this_failures() -> None:
    info = error_details_pb2.ErrorInfo(reason="SOMETHING_ELSE")
    status = status_pb2.Status(code=3, message="no", details=packed(info))
    error = errors.from_rpc_error(failed(status, code=grpc.StatusCode.UNAVAILABLE))
    assert isinstance(error, errors.Unavailable)
    assert (error.reason, error.field, error.message) == ("", None, "no")


def test_unknown_detail_types_are_skipped() -> None:
    info = error_details_pb2.ErrorInfo(reason="WORKSPACE_PAUSED")
    status = status_pb2.Status(
        code=9, message="paused", details=packed(timestamp_pb2.Timestamp(seconds=1), info)
    )
    error = errors.from_rpc_error(failed(status))
    assert isinstance(error, errors.FailedPrecondition) and error.reason == "WORKSPACE_PAUSED"


def test_a_transport_failure_has_no_details() -> None:
    error = errors.from_rpc_error(
        FailedCall(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    )
    assert isinstance(error, errors.Unavailable)
    assert (error.reason, error.violations, error.retry_after, error.field) == ("", (), None, None)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
        (grpc.StatusCode.NOT_FOUND, errors.NotFound),
        (grpc.StatusCode.ALREADY_EXISTS, errors.AlreadyExists),
        (grpc.StatusCode.FAILED_PRECONDITION, errors.FailedPrecondition),
        (grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDenied),
        (grpc.StatusCode.UNAUTHENTICATED, errors.Unauthenticated),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted),
        (grpc.StatusCode.UNAVAILABLE, errors.Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, errors.DeadlineExceeded),
        (grpc.StatusCode.INTERNAL, errors.GpufleetApiError),
    ],
)
def test_each_code_its_class(code: grpc.StatusCode, kind: type[errors.GpufleetApiError]) -> None:
    error = errors.from_rpc_error(FailedCall(code, "x"))
    assert type(error) is kind and error.code is code
