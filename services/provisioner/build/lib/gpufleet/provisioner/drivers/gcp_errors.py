"""How a Compute Engine failure becomes a typed error: from its codes, never its text.

A failure reaches the GCP driver in one of three ways:

- an HTTP error answer (``google.api_core.exceptions.GoogleAPICallError``): its status,
  the ``reason`` of each ``error.errors[]`` entry, and the reason of an ``ErrorInfo`` detail;
- an operation that finished with ``error.errors[].code`` and ``httpErrorStatusCode`` —
  the usual shape of a stockout (``ZONE_RESOURCE_POOL_EXHAUSTED``, 503) and of a regional
  quota (``QUOTA_EXCEEDED``, 403): the insert itself was answered 200;
- no answer at all. A request that never left (refused, connect timeout), and any read,
  is ``Transient``. A *mutation* that was sent but never answered (read timeout, connection
  dropped mid-answer) may or may not have happened: ``NotYetDone``, its outcome unknown —
  trying again is safe, because every mutation carries an idempotency key.

The codes are compared normalised (case and underscores dropped), because GCE spells the
same condition both ways: ``quotaExceeded`` in an HTTP error, ``QUOTA_EXCEEDED`` in an
operation. Codes decide before the HTTP status does: a 403 that says ``quotaExceeded`` is a
quota, a 403 that says ``rateLimitExceeded`` is throttling, any other 403 is auth.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import requests
import urllib3
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions

from gpufleet.common.errors import AlreadyExists, FailedPrecondition, GpufleetError
from gpufleet.common.provider_errors import (
    AuthFailed,
    InstanceNotFound,
    InsufficientCapacity,
    NotYetDone,
    QuotaExceeded,
    Transient,
)

__all__ = ["Failure", "classify", "failure_of_http", "failure_of_operation", "translate"]


def _norm(code: str) -> str:
    return code.replace("_", "").casefold()


def _codes(*codes: str) -> frozenset[str]:
    return frozenset(_norm(c) for c in codes)


# A zone cannot give us the machine now (GCE: "does not have enough resources available").
CAPACITY = _codes(
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_AVAILABILITY",  # ErrorInfo reason "resource_availability" inside a stockout
    "insufficientCapacity",  # bulk insert's spelling
)
QUOTA = _codes("QUOTA_EXCEEDED", "RESOURCE_QUOTA_EXCEEDED")
# Throttled, or the resource is busy with another operation: the same call later may work.
RETRY_LATER = _codes(
    "rateLimitExceeded",
    "userRateLimitExceeded",
    "RESOURCE_OPERATION_RATE_EXCEEDED",
    "resourceNotReady",
    "backendError",
    "internalError",
)
AUTH = _codes(
    "required",
    "authError",
    "forbidden",
    "insufficientPermissions",
    "accessNotConfigured",
    "SERVICE_DISABLED",
    "IAM_PERMISSION_DENIED",
    "CREDENTIALS_MISSING",
    "ACCESS_TOKEN_EXPIRED",
    "ACCESS_TOKEN_TYPE_UNSUPPORTED",
)
NOT_FOUND = _codes("notFound", "RESOURCE_NOT_FOUND")
CONFLICT = _codes("alreadyExists", "RESOURCE_ALREADY_EXISTS")


@dataclass(frozen=True)
class Failure:
    """What GCE said went wrong, whichever way it said it."""

    status: int | None
    codes: tuple[str, ...]
    message: str

    def has(self, table: frozenset[str]) -> bool:
        return any(_norm(code) in table for code in self.codes)


def classify(failure: Failure, *, about_instance: bool = True) -> GpufleetError:
    """The typed error for ``failure``.

    ``about_instance`` says whether a not-found names *our instance* (get, start, stop,
    delete) or something the request refers to (insert: a machine type, an image, a
    network), which is a configuration error rather than a missing machine.
    """
    text = f"GCE {failure.status or '-'} {','.join(failure.codes) or '-'}: {failure.message}"
    status = failure.status or 0
    if failure.has(CAPACITY):
        return InsufficientCapacity(text)
    if failure.has(QUOTA):
        return QuotaExceeded(text)
    if failure.has(RETRY_LATER):
        return Transient(text)
    if failure.has(AUTH) or status in (401, 403):
        return AuthFailed(text)
    if failure.has(NOT_FOUND) or status == 404:
        return InstanceNotFound(text) if about_instance else FailedPrecondition(text)
    if failure.has(CONFLICT) or status == 409:
        return AlreadyExists(text)
    if status == 429 or status >= 500:
        return Transient(text)
    # 400 and the like: the request can never succeed as configured.
    return FailedPrecondition(text)


def _reasons(entries: Iterable[Any]) -> list[str]:
    return [str(e["reason"]) for e in entries if isinstance(e, dict) and e.get("reason")]


def failure_of_http(exc: api_exceptions.GoogleAPICallError) -> Failure:
    codes = _reasons(exc.errors or ())
    if exc.reason:
        codes.append(str(exc.reason))
    status = exc.code if isinstance(exc.code, int) else None
    return Failure(status=status, codes=tuple(codes), message=str(exc.message))


def failure_of_operation(op: Any) -> Failure:
    """The failure an operation finished with (``compute_v1.Operation`` with errors)."""
    codes: list[str] = []
    messages: list[str] = []
    for error in op.error.errors:
        codes.append(error.code)
        messages.append(error.message)
        codes.extend(d.error_info.reason for d in error.error_details if d.error_info.reason)
    status = int(op.http_error_status_code) or None
    return Failure(status=status, codes=tuple(c for c in codes if c), message="; ".join(messages))


def _sent_unanswered(exc: BaseException) -> bool:
    """Whether the request went out and its answer never came back (from exception types)."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return False
    if isinstance(exc, (requests.exceptions.ReadTimeout, requests.exceptions.ChunkedEncodingError)):
        return True
    if isinstance(exc, requests.exceptions.ConnectionError):
        return any(isinstance(arg, urllib3.exceptions.ProtocolError) for arg in exc.args)
    return False


def translate(
    exc: BaseException, *, about_instance: bool = True, mutation: bool = False
) -> GpufleetError | None:
    """The typed error for an exception out of the SDK; None when it is not a provider failure.

    ``mutation``: the request changes something (insert, start, stop, delete), so an answer
    lost on the way back leaves its outcome unknown.
    """
    if isinstance(exc, api_exceptions.RetryError):
        cause = exc.cause
        if cause is not None and cause is not exc:
            return translate(cause, about_instance=about_instance, mutation=mutation)
        return Transient(f"GCE did not answer within the retry budget: {exc.message}")
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        return classify(failure_of_http(exc), about_instance=about_instance)
    if isinstance(exc, (auth_exceptions.RefreshError, auth_exceptions.DefaultCredentialsError)):
        return AuthFailed(f"GCP credentials were refused or are missing: {exc}")
    if mutation and _sent_unanswered(exc):
        return NotYetDone(
            f"GCE received the request but its answer was lost ({type(exc).__name__}); outcome unknown"
        )
    if isinstance(exc, (requests.exceptions.RequestException, auth_exceptions.TransportError)):
        return Transient(f"no answer from GCE ({type(exc).__name__})")
    return None
