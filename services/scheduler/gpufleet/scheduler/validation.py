"""Validation of what the product backend sends. Every refusal names the field, and
nothing is stored until the whole request is valid."""

from __future__ import annotations

import hashlib
import json
import re

from gpufleet.common.errors import InvalidArgument
from gpufleet.common.idempotency import optional_request_id as optional_request_id
from gpufleet.common.idempotency import required_request_id
from gpufleet.v1 import job_pb2

IDENT = re.compile(r"^[a-z0-9][a-z0-9_\-]{0,63}$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+\-]{0,63}$")
TENANT_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
JOB_ID = re.compile(r"^[A-Za-z0-9\-]{1,64}$")

MAX_TENANT_VALUES = 64
MAX_TENANT_VALUE_BYTES = 8192
MAX_TENANT_TOTAL_BYTES = 65536


def require(value: str, field: str, pattern: re.Pattern[str], what: str) -> str:
    if not value:
        raise InvalidArgument("is required", field=field)
    if not pattern.match(value):
        raise InvalidArgument(f"is not a valid {what}", field=field)
    return value


_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.?)+$|^\[[0-9A-Fa-f:.]+\]$")


def address(value: str, field: str) -> str:
    """A ``host:port`` the control plane will dial: a DNS name, an IPv4 address or a
    bracketed IPv6 address, and a port 1-65535 — never a path, a URL or a command."""
    if not value:
        raise InvalidArgument("is required", field=field)
    host, sep, port = value.rpartition(":")
    if (
        len(value) > 255
        or not sep
        or not _HOST.match(host)
        or not port.isdigit()
        or not 0 < int(port) < 65536
    ):
        raise InvalidArgument(
            "must be host:port (a name, an IPv4 or a [IPv6] address, a port 1-65535)", field=field
        )
    return value


def job_id(value: str, field: str = "job_id") -> str:
    """A job's id, or its resource name (``jobs/<id>``, as the API returns it)."""
    return require(value.removeprefix("jobs/"), field, JOB_ID, "job id or jobs/<id> name")


def machine_id(value: str, field: str = "machine_id") -> str:
    """A machine's id, or its resource name (``machines/<id>``)."""
    return require(value.removeprefix("machines/"), field, JOB_ID, "machine id or machines/<id> name")


def submission(request_id: str, job: job_pb2.Job | None, has_job: bool) -> str:
    """Checks a SubmitJob request's shape; returns the content hash for idempotency."""
    required_request_id(request_id)
    if not has_job or job is None:
        raise InvalidArgument("is required", field="job")
    require(job.workspace, "job.workspace", IDENT, "workspace id")
    require(job.pool, "job.pool", IDENT, "pool id")
    require(job.kind, "job.kind", IDENT, "job kind")
    require(job.pipeline_version, "job.pipeline_version", VERSION, "pipeline version")
    if len(job.tenant_values) > MAX_TENANT_VALUES:
        raise InvalidArgument(f"at most {MAX_TENANT_VALUES} entries", field="job.tenant_values")
    total = 0
    for key, value in job.tenant_values.items():
        if not TENANT_KEY.match(key):
            raise InvalidArgument(
                "keys are identifiers of at most 64 characters", field=f"job.tenant_values[{key[:64]!a}]"
            )
        size = len(value.encode())
        if size > MAX_TENANT_VALUE_BYTES:
            raise InvalidArgument(
                f"value is {size} bytes; at most {MAX_TENANT_VALUE_BYTES}",
                field=f"job.tenant_values[{key!r}]",
            )
        if "\x00" in value:
            raise InvalidArgument("value contains a NUL byte", field=f"job.tenant_values[{key!r}]")
        total += size + len(key)
    if total > MAX_TENANT_TOTAL_BYTES:
        raise InvalidArgument(
            f"{total} bytes in all; at most {MAX_TENANT_TOTAL_BYTES}", field="job.tenant_values"
        )
    content = {
        "workspace": job.workspace,
        "pool": job.pool,
        "kind": job.kind,
        "pipeline_version": job.pipeline_version,
        "tenant_values": dict(sorted(job.tenant_values.items())),
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
