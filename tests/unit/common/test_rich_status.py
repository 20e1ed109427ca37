"""The rich status an error ends its call with, read back as a client reads it."""

from __future__ import annotations

from typing import Any

import grpc

from gpufleet.common.errors import (
    DOMAIN,
    FIELD_METADATA_KEY,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Violation,
)
from gpufleet.common.provider_errors import InsufficientCapacity
from gpufleet.common.rich_status import ErrorDetails, details_of, status_of


class Ended(grpc.RpcError):
    """A failed call as a client holds it: its code and trailers (grpc.Call's accessors)."""

    def __init__(self, status: Any) -> None:
        self._status = status

    def code(self) -> grpc.StatusCode:
        return self._status.code  # type: ignore[no-any-return]

    def details(self) -> str:
        return self._status.details  # type: ignore[no-any-return]

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._status.trailing_metadata  # type: ignore[no-any-return]


def test_every_violation_travels_with_the_reason_and_domain() -> None:
    err = InvalidArgument.of(
        [Violation("job.pool", "is required", "REQUIRED"), Violation("job.kind", "is not a valid job kind")]
    )
    status = status_of(err)
    assert (status.code, status.details) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.pool: is required; job.kind: is not a valid job kind",
    )
    got = details_of(Ended(status))
    assert got.violations == err.violations
    assert (got.reason, got.domain, got.field) == ("INVALID_REQUEST", DOMAIN, "job.pool")
    assert got.retry_after_s is None


def test_only_errors_a_retry_can_help_carry_a_delay() -> None:
    assert details_of(Ended(status_of(Unavailable("database down")))).retry_after_s == 1.0
    assert details_of(Ended(status_of(ResourceExhausted("busy", retry_after_s=2.5)))).retry_after_s == 2.5
    assert details_of(Ended(status_of(NotFound("no job", field="job_id")))).retry_after_s is None


def test_a_field_outside_a_bad_request_is_named_in_error_info() -> None:
    got = details_of(Ended(status_of(NotFound("no job 'x'", field="job_id", reason="UNKNOWN_JOB"))))
    assert (got.reason, got.field, got.violations) == ("UNKNOWN_JOB", "job_id", ())


def test_a_provider_errors_reason_is_its_kind() -> None:
    assert details_of(Ended(status_of(InsufficientCapacity("stockout")))).reason == "INSUFFICIENT_CAPACITY"


def test_the_deprecated_field_trailer_goes_along_escaped() -> None:
    status = status_of(InvalidArgument("bad key", field="job.tenant_values['thème']"))
    assert (FIELD_METADATA_KEY, "job.tenant_values['th\\xe8me']") in status.trailing_metadata


def test_a_status_that_disagrees_with_the_call_is_ignored() -> None:
    status = status_of(InvalidArgument("bad", field="x"))

    class Other(Ended):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.INTERNAL

    assert details_of(Other(status)) == ErrorDetails()
