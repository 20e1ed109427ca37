"""A failed call's standard rich error, read as any gRPC client reads it: the
``google.rpc.Status`` decoded by grpcio-status (``rpc_status.from_call``) and its details
unpacked into ``google.rpc.error_details_pb2`` messages — not through gpufleet's own
decoder, so a test fails if what goes on the wire is not the standard."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

Detail = TypeVar(
    "Detail", error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.RetryInfo
)


def rich_status(err: grpc.RpcError) -> status_pb2.Status:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None, "no google.rpc.Status in the trailers"
    return status  # type: ignore[no-any-return]


def unpacked(status: status_pb2.Status, kind: type[Detail]) -> list[Detail]:
    out: list[Detail] = []
    for detail in status.details:
        message = kind()
        if detail.Unpack(message):
            out.append(message)
    return out


@dataclass(frozen=True)
class Refusal:
    """What a client learns from a refused call."""

    code: grpc.StatusCode
    # ErrorInfo: its reason, domain and metadata "field".
    reason: str
    domain: str
    field: str
    # BadRequest: (field, reason) of each violation, in order; empty without a BadRequest.
    violations: list[tuple[str, str]]
    # Each violation's description, in the same order.
    descriptions: list[str]
    retry: bool
    message: str


def refusal(method: Callable[..., object], request: object, timeout: float = 10) -> Refusal:
    """Call ``method`` with ``request`` (a stream is read to its end), which must fail, and
    decode its error."""
    with pytest.raises(grpc.RpcError) as info:
        answer = method(request, timeout=timeout)
        if hasattr(answer, "__next__"):
            list(answer)  # type: ignore[call-overload]
    err = info.value
    status = rich_status(err)
    (error_info,) = unpacked(status, error_details_pb2.ErrorInfo)
    bad = unpacked(status, error_details_pb2.BadRequest)
    assert len(bad) <= 1, "more than one BadRequest"
    violations = list(bad[0].field_violations) if bad else []
    return Refusal(
        code=err.code(),  # type: ignore[attr-defined]
        reason=error_info.reason,
        domain=error_info.domain,
        field=error_info.metadata.get("field", ""),
        violations=[(v.field, v.reason) for v in violations],
        descriptions=[v.description for v in violations],
        retry=bool(unpacked(status, error_details_pb2.RetryInfo)),
        message=err.details() or "",  # type: ignore[attr-defined]
    )


def assert_bad_request(got: Refusal, expected: list[tuple[str, str]]) -> None:
    """One INVALID_ARGUMENT naming exactly ``expected`` — (field, reason) of every bad field,
    in order — each with a description and in the message a person reads; its ErrorInfo
    INVALID_REQUEST in gpufleet.dev naming the first field; no RetryInfo (the same request
    cannot pass later)."""
    assert got.code == grpc.StatusCode.INVALID_ARGUMENT, got
    assert got.violations == expected
    assert all(got.descriptions), got.descriptions
    assert (got.reason, got.domain, got.field) == ("INVALID_REQUEST", "gpufleet.dev", expected[0][0])
    for field, _ in expected:
        assert field in got.message, (field, got.message)
    assert not got.retry


def assert_refused(got: Refusal, code: grpc.StatusCode, reason: str, field: str = "") -> None:
    """A refusal that is not about the request's shape: its code, its ErrorInfo reason in
    gpufleet.dev and the field it names, and no BadRequest."""
    assert (got.code, got.reason, got.domain, got.field) == (code, reason, "gpufleet.dev", field), got
    assert got.violations == [], got
