"""Validation of what the product backend and operators send. Every refusal names every bad
field of the request at once (into a :class:`~gpufleet.common.violations.Violations`), and
nothing is stored until the whole request is valid."""

from __future__ import annotations

import hashlib
import json
import re

from gpufleet.common.errors import InvalidArgument
from gpufleet.common.idempotency import REQUEST_ID
from gpufleet.common.idempotency import WHAT as REQUEST_ID_WHAT
from gpufleet.common.idempotency import optional_request_id as optional_request_id
from gpufleet.common.violations import AT_ONCE
from gpufleet.common.violations import Violations as Violations
from gpufleet.v1 import job_pb2

IDENT = re.compile(r"^[a-z0-9][a-z0-9_\-]{0,63}$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+\-]{0,63}$")
TENANT_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
JOB_ID = re.compile(r"^[A-Za-z0-9\-]{1,64}$")

MAX_TENANT_VALUES = 64
MAX_TENANT_VALUE_BYTES = 8192
MAX_TENANT_TOTAL_BYTES = 65536


def require(value: str, field: str, pattern: re.Pattern[str], what: str, found: Violations = AT_ONCE) -> str:
    """``value``, required and matching ``pattern`` (else reported into ``found``)."""
    found.check(value, field, pattern, what)
    return value


_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.?)+$|^\[[0-9A-Fa-f:.]+\]$")


def address(value: str, field: str, found: Violations = AT_ONCE) -> str:
    """A ``host:port`` the control plane will dial: a DNS name, an IPv4 address or a
    bracketed IPv6 address, and a port 1-65535 — never a path, a URL or a command."""
    if not value:
        found.add(field, "is required", "REQUIRED")
        return value
    host, sep, port = value.rpartition(":")
    if (
        len(value) > 255
        or not sep
        or not _HOST.match(host)
        or not port.isdigit()
        or not 0 < int(port) < 65536
    ):
        found.add(
            field, "must be host:port (a name, an IPv4 or a [IPv6] address, a port 1-65535)", "INVALID_FORMAT"
        )
    return value


def job_id(value: str, found: Violations = AT_ONCE, field: str = "job_id") -> str:
    """A job's id, or its resource name (``jobs/<id>``, as the API returns it)."""
    return require(value.removeprefix("jobs/"), field, JOB_ID, "job id or jobs/<id> name", found)


def machine_id(value: str, found: Violations = AT_ONCE, field: str = "machine_id") -> str:
    """A machine's id, or its resource name (``machines/<id>``)."""
    return require(value.removeprefix("machines/"), field, JOB_ID, "machine id or machines/<id> name", found)


# At most this many of a map's (or a list's) bad entries are named one by one; the rest
# are counted.
MAX_ENTRY_VIOLATIONS = 20


def submission(request_id: str, job: job_pb2.Job | None, has_job: bool) -> Violations:
    """Every violation of a SubmitJob request's shape (none for a good one). ``pool`` and
    ``pipeline_version`` may be left out — the kind's catalogue entry fills them in
    (:func:`with_defaults`) — but when given they must be well formed. A request with no
    ``job`` at all is refused at once: nothing else can be checked."""
    found = Violations()
    found.check(request_id, "request_id", REQUEST_ID, REQUEST_ID_WHAT)
    if not has_job or job is None:
        found.add("job", "is required", "REQUIRED")
        raise InvalidArgument.of(found.found)
    found.check(job.workspace, "job.workspace", IDENT, "workspace id")
    found.check(job.pool, "job.pool", IDENT, "pool id", required=False)
    found.check(job.kind, "job.kind", IDENT, "job kind")
    found.check(job.pipeline_version, "job.pipeline_version", VERSION, "pipeline version", required=False)
    _tenant_values(job, found)
    return found


def _tenant_values(job: job_pb2.Job, found: Violations) -> None:
    if len(job.tenant_values) > MAX_TENANT_VALUES:
        found.add("job.tenant_values", f"at most {MAX_TENANT_VALUES} entries", "TOO_MANY")
    total = 0
    named = 0
    for key, value in sorted(job.tenant_values.items()):
        size = len(value.encode())
        total += size + len(key)
        problem: tuple[str, str] | None = None
        if not TENANT_KEY.match(key):
            problem = ("keys are identifiers of at most 64 characters", "INVALID_FORMAT")
        elif size > MAX_TENANT_VALUE_BYTES:
            problem = (f"value is {size} bytes; at most {MAX_TENANT_VALUE_BYTES}", "TOO_LARGE")
        elif "\x00" in value:
            problem = ("value contains a NUL byte", "INVALID_FORMAT")
        if problem is None:
            continue
        named += 1
        if named <= MAX_ENTRY_VIOLATIONS:
            found.add(f"job.tenant_values[{key[:64]!a}]", *problem)
    if named > MAX_ENTRY_VIOLATIONS:
        found.add(
            "job.tenant_values", f"{named - MAX_ENTRY_VIOLATIONS} more bad entries not listed", "INVALID"
        )
    if total > MAX_TENANT_TOTAL_BYTES:
        found.add("job.tenant_values", f"{total} bytes in all; at most {MAX_TENANT_TOTAL_BYTES}", "TOO_LARGE")


def with_defaults(
    job: job_pb2.Job, default_pool: str | None, default_pipeline_version: str | None, found: Violations
) -> job_pb2.Job:
    """``job`` with the pool and pipeline version it left out taken from its kind's
    catalogue entry; what is still missing (the kind has no default) is added to
    ``found``, saying so."""
    filled = job_pb2.Job()
    filled.CopyFrom(job)
    if not filled.pool:
        if default_pool:
            filled.pool = default_pool
        else:
            found.add("job.pool", f"is required: kind {job.kind!r} has no default pool", "REQUIRED")
    if not filled.pipeline_version:
        if default_pipeline_version:
            filled.pipeline_version = default_pipeline_version
        else:
            found.add(
                "job.pipeline_version",
                f"is required: kind {job.kind!r} has no default pipeline version",
                "REQUIRED",
            )
    return filled


def content_hash(job: job_pb2.Job) -> str:
    """The SubmitJob content a request_id stands for, as the client sent it (before any
    default is filled in: a retry of the same request matches even if the catalogue's
    defaults changed between the two)."""
    content = {
        "workspace": job.workspace,
        "pool": job.pool,
        "kind": job.kind,
        "pipeline_version": job.pipeline_version,
        "tenant_values": dict(sorted(job.tenant_values.items())),
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
