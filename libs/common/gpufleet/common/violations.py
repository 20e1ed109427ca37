"""Collecting every violation of a request before refusing it, for every service.

A handler checks each field of its request into one :class:`Violations` and calls
:meth:`Violations.raise_if_any` once, before it reads the store: the answer is one
INVALID_ARGUMENT whose ``BadRequest`` names every bad field, so a client fixes its request
in one go instead of learning its mistakes one call at a time.

The shared checks (page sizes and tokens, request ids, ids) take the collector as their
last argument. Left out, it is :data:`AT_ONCE`, which refuses at the first violation —
what a caller that checks a single field wants.

Each violation carries a stable reason a program can switch on (``FieldViolation.reason``);
the ErrorInfo of such an answer says ``INVALID_REQUEST``. The reasons used here:

- ``REQUIRED``: the field is empty and must not be;
- ``INVALID_FORMAT``: the value is not of the form the field takes;
- ``OUT_OF_RANGE``: a number or time outside what the field allows;
- ``TOO_LONG`` / ``TOO_LARGE`` / ``TOO_MANY``: over a length, size or count limit;
- ``UNKNOWN_VALUE``: an enum number this build does not know;
- ``NOT_SETTABLE``: an update mask path the method does not set;
- ``INVALID_PAGE_TOKEN``: not a token this list gave out (start again from the first page).
"""

from __future__ import annotations

import re
from collections.abc import Collection

from gpufleet.common.errors import InvalidArgument, Violation


class Violations:
    """A request's violations, in the order its fields were checked."""

    def __init__(self) -> None:
        self.found: list[Violation] = []

    def add(self, field: str, description: str, reason: str = "INVALID") -> None:
        self.found.append(Violation(field, description, reason))

    def check(
        self, value: str, field: str, pattern: re.Pattern[str], what: str, *, required: bool = True
    ) -> None:
        """Empty (when required) or not matching ``pattern``."""
        if not value:
            if required:
                self.add(field, "is required", "REQUIRED")
            return
        if not pattern.match(value):
            self.add(field, f"is not a valid {what}", "INVALID_FORMAT")

    def at_most(self, value: str, field: str, limit: int) -> None:
        """Longer than ``limit`` characters."""
        if len(value) > limit:
            self.add(field, f"longer than {limit} characters", "TOO_LONG")

    def known(self, value: int, known: Collection[int], field: str, what: str) -> None:
        """An enum number: 0 (unset) or one of ``known`` (the enum's ``values()``)."""
        if value and value not in known:
            self.add(field, f"unknown {what} {value}", "UNKNOWN_VALUE")

    def raise_if_any(self) -> None:
        """Refuse the request with every violation found, if there is one."""
        if self.found:
            raise InvalidArgument.of(self.found)


class _AtOnce(Violations):
    """Refuses at the first violation instead of collecting; holds nothing, so one
    instance serves every caller."""

    def add(self, field: str, description: str, reason: str = "INVALID") -> None:
        raise InvalidArgument.of([Violation(field, description, reason)])


# What a shared check reports into when its caller collects nothing.
AT_ONCE: Violations = _AtOnce()
