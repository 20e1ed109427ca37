"""The request ids clients send on calls that create, change or destroy, checked in one
place for every service (DESIGN §8: a ``request_id`` on every such call)."""

from __future__ import annotations

import re

from gpufleet.common.violations import AT_ONCE, Violations

REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")
WHAT = "request id (1-128 of A-Z a-z 0-9 . _ : -)"


def optional_request_id(value: str, found: Violations = AT_ONCE) -> str:
    """The request_id of a call that is idempotent by its nature (repeating it answers the
    state it left): optional, but when given it must be well formed."""
    found.check(value, "request_id", REQUEST_ID, WHAT, required=False)
    return value


def required_request_id(value: str, found: Violations = AT_ONCE) -> str:
    """The request_id of a call that is idempotent only by it (a create): required."""
    found.check(value, "request_id", REQUEST_ID, WHAT)
    return value
