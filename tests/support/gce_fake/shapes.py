"""The JSON shapes of the Compute Engine v1 REST API that the fake answers with.

Taken from the API reference and from real answers seen in the wild: error bodies
(``error.code``, ``error.message``, ``error.errors[].reason``, ``details[]`` with an
``ErrorInfo``), operations (``status`` PENDING/RUNNING/DONE, ``error.errors[].code`` and
``httpErrorStatusCode`` for a failed one), instances (int64 ids as strings, RFC 3339
timestamps with an offset, full resource URLs), aggregated lists (``items`` keyed by
``zones/<zone>``, a ``warning`` for a zone with nothing on the page).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

BASE = "https://www.googleapis.com/compute/v1"
# GCE writes timestamps in US Pacific time with an explicit offset.
_PACIFIC = timezone(timedelta(hours=-8))

# Status -> (reason, domain, gRPC-style status name): what GCE puts in an error body.
DEFAULT_REASONS: dict[int, tuple[str, str, str]] = {
    400: ("invalid", "global", "INVALID_ARGUMENT"),
    401: ("required", "global", "UNAUTHENTICATED"),
    403: ("forbidden", "global", "PERMISSION_DENIED"),
    404: ("notFound", "global", "NOT_FOUND"),
    409: ("alreadyExists", "global", "ALREADY_EXISTS"),
    429: ("rateLimitExceeded", "usageLimits", "RESOURCE_EXHAUSTED"),
    500: ("backendError", "global", "INTERNAL"),
    502: ("backendError", "global", "UNAVAILABLE"),
    503: ("backendError", "global", "UNAVAILABLE"),
}
HTTP_MESSAGES = {403: "FORBIDDEN", 404: "NOT FOUND", 409: "CONFLICT", 503: "SERVICE UNAVAILABLE"}


def rfc3339(at: datetime) -> str:
    return at.astimezone(_PACIFIC).isoformat(timespec="milliseconds")


def error_body(
    status: int, message: str, reason: str | None = None, *, domain: str | None = None
) -> dict[str, Any]:
    """An HTTP error answer as GCE writes it."""
    default_reason, default_domain, status_name = DEFAULT_REASONS.get(
        status, ("backendError", "global", "UNKNOWN")
    )
    entry = {"message": message, "domain": domain or default_domain, "reason": reason or default_reason}
    body: dict[str, Any] = {"code": status, "message": message, "errors": [entry], "status": status_name}
    if status == 401:
        body["errors"][0].update(location="Authorization", locationType="header")
        body["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "CREDENTIALS_MISSING",
                "domain": "googleapis.com",
                "metadata": {"service": "compute.googleapis.com"},
            }
        ]
    return {"error": body}


def not_found(project: str, path: str) -> dict[str, Any]:
    return error_body(404, f"The resource 'projects/{project}/{path}' was not found")


def invalid(field: str, value: str, why: str = "") -> dict[str, Any]:
    return error_body(400, f"Invalid value for field '{field}': '{value}'. {why}".rstrip())


def stockout_error(project: str, zone: str, machine_type: str) -> dict[str, Any]:
    """A stockout as an operation's ``error`` (with its ``resource_availability`` detail)."""
    return {
        "errors": [
            {
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                "message": f"The zone 'projects/{project}/zones/{zone}' does not have enough resources "
                "available to fulfill the request.  Try a different zone, or try again later.",
                "errorDetails": [
                    {
                        "errorInfo": {
                            "reason": "resource_availability",
                            "domain": "compute.googleapis.com",
                            "metadatas": {"zone": zone, "vmType": machine_type, "zonesAvailable": ""},
                        }
                    },
                    {
                        "help": {
                            "links": [
                                {
                                    "description": "Troubleshooting documentation",
                                    "url": "https://cloud.google.com/compute/docs/resource-error",
                                }
                            ]
                        }
                    },
                ],
            }
        ]
    }


def quota_error(metric: str, region: str, limit: float) -> dict[str, Any]:
    """A regional quota as an operation's ``error`` (with its ``quotaInfo`` detail)."""
    return {
        "errors": [
            {
                "code": "QUOTA_EXCEEDED",
                "message": f"Quota '{metric}' exceeded.  Limit: {limit:.1f} in region {region}.",
                "errorDetails": [
                    {
                        "quotaInfo": {
                            "metricName": f"compute.googleapis.com/{metric.lower()}",
                            "limitName": f"{metric}-per-project-region",
                            "dimensions": {"region": region},
                            "limit": limit,
                        }
                    }
                ],
            }
        ]
    }


def operation_error(code: str, message: str) -> dict[str, Any]:
    return {"errors": [{"code": code, "message": message}]}


def no_results_warning(scope: str) -> dict[str, Any]:
    return {
        "code": "NO_RESULTS_ON_PAGE",
        "message": f"There are no results for scope '{scope}' on this page.",
        "data": [{"key": "scope", "value": scope}],
    }


# ---- list filters -----------------------------------------------------------------------

_TERM = re.compile(
    r"""\s*(?:AND\s+)?\(?\s*(?P<field>[A-Za-z][A-Za-z0-9_.\-]*)\s*(?P<op>=|!=|\beq\b|\bne\b)\s*
        (?P<value>"(?:[^"\\]|\\.)*"|[^\s()"]+)\s*\)?\s*""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Term:
    field: str
    op: str
    value: str

    def matches(self, resource: dict[str, Any]) -> bool:
        found: Any = resource
        for part in self.field.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        text = "" if found is None else str(found)
        if self.op in ("=", "!="):
            return (text == self.value) == (self.op == "=")
        return bool(re.fullmatch(self.value, text)) == (self.op == "eq")


def parse_filter(text: str) -> list[Term] | None:
    """The subset of the list ``filter`` syntax the fake understands: terms such as
    ``(labels.a = "b")`` or ``status != RUNNING`` or ``name eq gf-.*``, joined by AND or
    by juxtaposition. None when the text is not that (the fake answers 400, as GCE does
    for a filter it cannot parse)."""
    terms: list[Term] = []
    pos = 0
    while pos < len(text):
        match = _TERM.match(text, pos)
        if match is None or match.end() == pos:
            return None
        value = match["value"]
        if value.startswith('"'):
            value = value[1:-1].replace('\\"', '"')
        terms.append(Term(match["field"], match["op"], value))
        pos = match.end()
    return terms
