"""Classifying Compute Engine failures: a table of codes and statuses, and what reaches it."""

from __future__ import annotations

import pytest
import requests
import urllib3
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from google.cloud import compute_v1

from gpufleet.common.errors import AlreadyExists, FailedPrecondition, GpufleetError
from gpufleet.common.provider_errors import (
    AuthFailed,
    InstanceNotFound,
    InsufficientCapacity,
    NotYetDone,
    QuotaExceeded,
    Transient,
)
from gpufleet.provisioner.drivers.gcp_errors import (
    Failure,
    classify,
    failure_of_http,
    failure_of_operation,
    translate,
)

# (HTTP status or an operation's httpErrorStatusCode, codes) -> typed error
TABLE: list[tuple[int | None, tuple[str, ...], type[GpufleetError]]] = [
    (503, ("ZONE_RESOURCE_POOL_EXHAUSTED",), InsufficientCapacity),
    (503, ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",), InsufficientCapacity),
    (None, ("ZONE_RESOURCE_POOL_EXHAUSTED",), InsufficientCapacity),
    (503, ("UNKNOWN_NEW_CODE", "resource_availability"), InsufficientCapacity),
    (503, ("insufficientCapacity",), InsufficientCapacity),
    (403, ("QUOTA_EXCEEDED",), QuotaExceeded),
    (403, ("quotaExceeded",), QuotaExceeded),
    (429, ("RESOURCE_QUOTA_EXCEEDED",), QuotaExceeded),
    (403, ("rateLimitExceeded",), Transient),
    (429, ("userRateLimitExceeded",), Transient),
    (429, (), Transient),
    (400, ("resourceNotReady",), Transient),
    (400, ("RESOURCE_OPERATION_RATE_EXCEEDED",), Transient),
    (500, (), Transient),
    (502, ("backendError",), Transient),
    (503, (), Transient),
    (504, (), Transient),
    (401, ("required", "CREDENTIALS_MISSING"), AuthFailed),
    (401, (), AuthFailed),
    (403, ("forbidden",), AuthFailed),
    (403, ("accessNotConfigured", "SERVICE_DISABLED"), AuthFailed),
    (403, (), AuthFailed),
    (404, ("notFound",), InstanceNotFound),
    (404, (), InstanceNotFound),
    (None, ("RESOURCE_NOT_FOUND",), InstanceNotFound),
    (409, ("alreadyExists",), AlreadyExists),
    (400, ("invalid",), FailedPrecondition),
    (412, ("conditionNotMet",), FailedPrecondition),
]


@pytest.mark.parametrize(("status", "codes", "expected"), TABLE, ids=lambda v: str(v))
def test_classification_table(
    status: int | None, codes: tuple[str, ...], expected: type[GpufleetError]
) -> None:
    error = classify(Failure(status=status, codes=codes, message="text is never read"))
    assert type(error) is expected


def test_the_message_never_decides() -> None:
    misleading = Failure(
        status=503, codes=("backendError",), message="ZONE_RESOURCE_POOL_EXHAUSTED quota 404"
    )
    assert type(classify(misleading)) is Transient


def test_a_not_found_on_insert_is_a_configuration_error_not_a_missing_machine() -> None:
    missing_image = Failure(status=404, codes=("notFound",), message="image not found")
    assert type(classify(missing_image, about_instance=False)) is FailedPrecondition
    assert type(classify(missing_image, about_instance=True)) is InstanceNotFound


def test_a_failed_operation_gives_its_codes_and_http_status() -> None:
    op = compute_v1.Operation(
        name="operation-1",
        status=compute_v1.Operation.Status.DONE,
        http_error_status_code=503,
        error=compute_v1.Error(
            errors=[
                compute_v1.Errors(
                    code="ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                    message="The zone does not have enough resources",
                    error_details=[
                        compute_v1.ErrorDetails(
                            error_info=compute_v1.ErrorInfo(reason="resource_availability")
                        )
                    ],
                )
            ]
        ),
    )
    failure = failure_of_operation(op)
    assert failure.status == 503
    assert failure.codes == ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "resource_availability")
    assert type(classify(failure)) is InsufficientCapacity


def test_an_http_error_gives_its_reasons_and_error_info() -> None:
    exc = api_exceptions.from_http_status(
        403,
        "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally.",
        errors=[{"message": "...", "domain": "usageLimits", "reason": "quotaExceeded"}],
    )
    failure = failure_of_http(exc)
    assert (failure.status, failure.codes) == (403, ("quotaExceeded",))
    assert type(translate(exc)) is QuotaExceeded


def test_an_exhausted_retry_is_classified_by_its_last_cause() -> None:
    cause = api_exceptions.from_http_status(503, "unavailable", errors=[{"reason": "backendError"}])
    assert type(translate(api_exceptions.RetryError("deadline", cause))) is Transient
    auth = api_exceptions.from_http_status(401, "login required")
    assert type(translate(api_exceptions.RetryError("deadline", auth))) is AuthFailed


def _refused() -> requests.exceptions.ConnectionError:
    """What requests raises for a port nobody listens on: the request never left."""
    try:
        requests.get("http://127.0.0.1:9/", timeout=5)
    except requests.exceptions.ConnectionError as exc:
        return exc
    raise AssertionError("something listens on port 9")


def _dropped() -> requests.exceptions.ConnectionError:
    return requests.exceptions.ConnectionError(urllib3.exceptions.ProtocolError("Connection aborted."))


@pytest.mark.parametrize(
    ("exc", "mutation", "expected"),
    [
        (requests.exceptions.ReadTimeout(), True, NotYetDone),
        (requests.exceptions.ReadTimeout(), False, Transient),
        (_dropped(), True, NotYetDone),
        (_dropped(), False, Transient),
        (requests.exceptions.ConnectTimeout(), True, Transient),
        (_refused(), True, Transient),
        (auth_exceptions.RefreshError("invalid_grant"), False, AuthFailed),
        (auth_exceptions.DefaultCredentialsError("none found"), True, AuthFailed),
        (auth_exceptions.TransportError("metadata server down"), False, Transient),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_no_answer_is_transient_unless_a_sent_change_lost_its_answer(
    exc: BaseException, mutation: bool, expected: type[GpufleetError]
) -> None:
    assert type(translate(exc, mutation=mutation)) is expected


def test_anything_else_is_not_a_provider_failure() -> None:
    assert translate(KeyError("a bug")) is None
