"""The aws driver's error table: every EC2 failure typed from its code or exception type."""

from __future__ import annotations

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.parsers import ResponseParserError

from gpufleet.common.provider_errors import (
    AuthFailed,
    InstanceNotFound,
    InsufficientCapacity,
    NotYetDone,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from gpufleet.provisioner.drivers.aws_errors import EC2_CODES, classify, ec2_errors


def ec2_error(code: str, status: int = 400, operation: str = "RunInstances") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
    )


TABLE = [
    # EC2 sends capacity errors with HTTP 500: the code wins, a stockout is never "transient".
    ("InsufficientInstanceCapacity", 500, InsufficientCapacity),
    ("InsufficientCapacity", 500, InsufficientCapacity),
    ("InsufficientHostCapacity", 500, InsufficientCapacity),
    ("SpotMaxPriceTooLow", 400, InsufficientCapacity),
    ("InstanceLimitExceeded", 400, QuotaExceeded),
    ("VcpuLimitExceeded", 400, QuotaExceeded),
    ("MaxSpotInstanceCountExceeded", 400, QuotaExceeded),
    ("UnauthorizedOperation", 403, AuthFailed),
    ("AuthFailure", 401, AuthFailed),
    ("InvalidClientTokenId", 403, AuthFailed),
    ("OptInRequired", 401, AuthFailed),
    ("InvalidInstanceID.NotFound", 400, InstanceNotFound),
    ("InvalidInstanceID.Malformed", 400, InstanceNotFound),
    ("RequestLimitExceeded", 503, Transient),
    ("Throttling", 400, Transient),
    ("InternalError", 500, Transient),
    ("Unavailable", 503, Transient),
    ("IncorrectInstanceState", 400, Transient),
    ("SomethingNew", 502, Transient),  # unknown, but 5xx: the provider's trouble
    ("InvalidParameterValue", 400, ProviderError),  # unknown 4xx: untyped, never guessed
    ("IdempotentParameterMismatch", 400, ProviderError),
]


@pytest.mark.parametrize(("code", "status", "kind"), TABLE, ids=[t[0] for t in TABLE])
def test_each_code_has_its_type(code: str, status: int, kind: type[ProviderError]) -> None:
    typed = classify(ec2_error(code, status), "RunInstances")
    assert type(typed) is kind
    assert typed is not None and code in typed.message


def test_every_code_in_the_table_types_as_the_table_says() -> None:
    for code, kind in EC2_CODES.items():
        assert type(classify(ec2_error(code, 400), "StopInstances")) is kind, code


@pytest.mark.parametrize(
    ("operation", "kind"),
    [("RunInstances", InsufficientCapacity), ("StartInstances", InsufficientCapacity),
     ("DescribeInstances", ProviderError), ("TerminateInstances", ProviderError)],
)  # fmt: skip
def test_unsupported_is_a_stockout_only_where_it_places_an_instance(
    operation: str, kind: type[ProviderError]
) -> None:
    assert type(classify(ec2_error("Unsupported", 400, operation), operation)) is kind


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (NoCredentialsError(), AuthFailed),
        (PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"), AuthFailed),
        (EndpointConnectionError(endpoint_url="http://x"), Transient),
        (ConnectTimeoutError(endpoint_url="http://x"), Transient),
        (ConnectionClosedError(endpoint_url="http://x"), Transient),
        (ReadTimeoutError(endpoint_url="http://x"), NotYetDone),
        (ResponseParserError("<html>"), Transient),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else v.kind,
)
def test_transport_and_credential_failures(exc: Exception, kind: type[ProviderError]) -> None:
    assert type(classify(exc, "DescribeInstances")) is kind


def test_a_bug_on_our_side_is_not_dressed_as_a_provider_error() -> None:
    bad = ParamValidationError(report="MinCount is required")
    assert classify(bad, "RunInstances") is None
    with pytest.raises(ParamValidationError), ec2_errors("RunInstances"):
        raise bad


def test_ec2_errors_raises_the_typed_error_chained_to_the_sdk_one() -> None:
    original = ec2_error("VcpuLimitExceeded")
    with pytest.raises(QuotaExceeded) as raised, ec2_errors("RunInstances"):
        raise original
    assert raised.value.__cause__ is original
