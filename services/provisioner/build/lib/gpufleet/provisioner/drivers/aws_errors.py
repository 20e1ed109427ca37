"""EC2 failures as typed provider errors, decided from error codes and exception types only.

One table (:data:`EC2_CODES`) says what each EC2 error code means to the platform; a code
it does not name falls back on the HTTP status (5xx: the provider's trouble, try again
later) and otherwise stays an untyped :class:`ProviderError` naming the code, so nothing
is mistaken for a stockout or a quota. Message text is never read.

Two rules beyond the table:

- EC2 sends its capacity errors (``InsufficientInstanceCapacity`` ...) with HTTP 500, so
  the code is looked up *before* the status: a stockout is never "transient".
- ``Unsupported`` is a capacity answer only where EC2 uses it for one — RunInstances or
  StartInstances asking for an instance type the offering's zone does not have. The
  scale step must then do what it does for a stockout: try the next offering and
  quarantine this one. From any other call it stays untyped.

Transport failures: a connection that could not be made or broke is ``Transient``; a
read timeout is ``NotYetDone`` — the request may have reached EC2 and taken effect, so
its outcome is unknown (a retried create then adopts whatever it made, by its tag).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import (
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
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

__all__ = ["EC2_CODES", "classify", "ec2_errors", "error_code"]

EC2_CODES: dict[str, type[ProviderError]] = {
    # The zone has no capacity for this type (on-demand or spot) right now.
    "InsufficientInstanceCapacity": InsufficientCapacity,
    "InsufficientCapacity": InsufficientCapacity,
    "InsufficientHostCapacity": InsufficientCapacity,
    "InsufficientReservedInstanceCapacity": InsufficientCapacity,
    # The spot price is above what we would pay (we set no max: the on-demand price).
    "SpotMaxPriceTooLow": InsufficientCapacity,
    # The account's limits.
    "InstanceLimitExceeded": QuotaExceeded,
    "VcpuLimitExceeded": QuotaExceeded,
    "MaxSpotInstanceCountExceeded": QuotaExceeded,
    # Credentials missing, wrong, expired, or not allowed to do this.
    "UnauthorizedOperation": AuthFailed,
    "AuthFailure": AuthFailed,
    "InvalidClientTokenId": AuthFailed,
    "SignatureDoesNotMatch": AuthFailed,
    "ExpiredToken": AuthFailed,
    "MissingAuthenticationToken": AuthFailed,
    "OptInRequired": AuthFailed,
    "Blocked": AuthFailed,
    # The instance does not exist (or the id cannot name one).
    "InvalidInstanceID.NotFound": InstanceNotFound,
    "InvalidInstanceID.Malformed": InstanceNotFound,
    # Worth trying again later.
    "RequestLimitExceeded": Transient,
    "Throttling": Transient,
    "ThrottlingException": Transient,
    "InternalError": Transient,
    "InternalFailure": Transient,
    "ServiceUnavailable": Transient,
    "Unavailable": Transient,
    "RequestTimeout": Transient,
    # Stopping a pending instance, starting a stopping one: the state will move on.
    "IncorrectInstanceState": Transient,
    "IncorrectSpotRequestState": Transient,
}

# Where ``Unsupported`` means "this zone does not offer this instance type".
_PLACING_OPERATIONS = frozenset({"RunInstances", "StartInstances"})


def error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _status(err: ClientError) -> int:
    status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return int(status) if isinstance(status, int) else 0


def classify(exc: Exception, operation: str) -> ProviderError | None:
    """The typed error for a boto3/botocore failure of ``operation``; None when ``exc``
    is not a provider failure at all (a bug on our side, e.g. a parameter validation
    error), which the caller then lets propagate unchanged."""
    if isinstance(exc, ClientError):
        code = error_code(exc)
        what = f"EC2 {operation}: {code}"
        message = str(exc.response.get("Error", {}).get("Message", "")).strip()
        text = f"{what}: {message}" if message else what
        if code == "Unsupported" and operation in _PLACING_OPERATIONS:
            return InsufficientCapacity(text)
        kind = EC2_CODES.get(code)
        if kind is not None:
            return kind(text)
        if _status(exc) >= 500:
            return Transient(text)
        return ProviderError(text)
    if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
        return AuthFailed(f"EC2 {operation}: no usable AWS credentials ({exc})")
    if isinstance(exc, ReadTimeoutError):
        return NotYetDone(f"EC2 {operation}: no answer within the read timeout; outcome unknown ({exc})")
    # EndpointConnectionError, ConnectTimeoutError, ConnectionClosedError and the like.
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return Transient(f"EC2 {operation}: {exc}")
    if isinstance(exc, ResponseParserError):
        # Something between us and EC2 answered with a page that is not EC2's (a proxy's
        # error page, an endpoint crashing): nothing to classify, try again later.
        return Transient(f"EC2 {operation}: unreadable answer")
    return None


@contextmanager
def ec2_errors(operation: str) -> Iterator[None]:
    """Re-raise boto failures inside the block as the typed error :func:`classify` names."""
    try:
        yield
    except ProviderError:
        raise
    except Exception as exc:
        typed = classify(exc, operation)
        if typed is None:
            raise
        raise typed from exc
