"""The one collector every service checks a request into, and the shared checks that report
into it: every violation in the order checked, or — given no collector — a refusal at the
first, with the same field and reason."""

from __future__ import annotations

import re

import pytest

from gpufleet.common import paging
from gpufleet.common.errors import InvalidArgument, Violation
from gpufleet.common.idempotency import optional_request_id, required_request_id
from gpufleet.common.violations import Violations

IDENT = re.compile(r"^[a-z]+$")


def reasons(found: Violations) -> list[tuple[str, str]]:
    return [(v.field, v.reason) for v in found.found]


def test_every_violation_is_kept_in_order_and_raised_once() -> None:
    found = Violations()
    found.check("", "a", IDENT, "name")
    found.check("", "b", IDENT, "name", required=False)
    found.check("Not!", "c", IDENT, "name")
    found.at_most("x" * 11, "d", 10)
    found.at_most("x" * 10, "e", 10)
    found.known(7, [0, 1, 2], "f", "state")
    found.known(0, [1, 2], "g", "state")
    assert reasons(found) == [
        ("a", "REQUIRED"),
        ("c", "INVALID_FORMAT"),
        ("d", "TOO_LONG"),
        ("f", "UNKNOWN_VALUE"),
    ]
    with pytest.raises(InvalidArgument) as info:
        found.raise_if_any()
    assert info.value.violations == tuple(found.found)
    assert (info.value.field, info.value.reason) == ("a", "INVALID_REQUEST")
    assert (
        info.value.message
        == "a: is required; c: is not a valid name; d: longer than 10 characters; f: unknown state 7"
    )


def test_a_shared_check_given_a_collector_reports_and_answers_as_for_the_first_page() -> None:
    found = Violations()
    assert paging.page_size(-1, found) == paging.DEFAULT_PAGE_SIZE
    assert paging.decode_int("ledger", "%%%", found) is None
    assert paging.decode_int("ledger", paging.encode("ledger", -1), found) is None
    assert paging.decode_str("pools", paging.encode("pools", 7), found) is None
    assert paging.decode("pools", paging.encode("plans", "p"), found) is None
    assert optional_request_id("has spaces", found) == "has spaces"
    assert required_request_id("", found) == ""
    assert reasons(found) == [
        ("page_size", "OUT_OF_RANGE"),
        *[("page_token", "INVALID_PAGE_TOKEN")] * 4,
        ("request_id", "INVALID_FORMAT"),
        ("request_id", "REQUIRED"),
    ]


def test_good_values_pass_through() -> None:
    found = Violations()
    assert paging.page_size(0, found) == paging.DEFAULT_PAGE_SIZE
    assert paging.page_size(5000, found) == paging.MAX_PAGE_SIZE
    assert paging.decode_int("ledger", paging.encode("ledger", 12), found) == 12
    assert paging.keyed_page("pools", 3, paging.encode("pools", "l4")) == (3, "l4")
    assert paging.keyed_page("pools", 0, "") == (paging.DEFAULT_PAGE_SIZE, "")
    assert optional_request_id("", found) == ""
    assert found.found == []
    found.raise_if_any()  # nothing found: nothing refused


def test_without_a_collector_a_check_refuses_at_once_with_its_reason() -> None:
    with pytest.raises(InvalidArgument) as info:
        paging.page_size(-1)
    assert info.value.violations == (Violation("page_size", "must not be negative", "OUT_OF_RANGE"),)
    assert str(info.value) == "page_size: must not be negative"
    with pytest.raises(InvalidArgument) as info:
        paging.decode("pools", paging.encode("plans", "p"))
    assert [(v.field, v.reason) for v in info.value.violations] == [("page_token", "INVALID_PAGE_TOKEN")]


def test_a_keyed_page_names_both_bad_fields() -> None:
    with pytest.raises(InvalidArgument) as info:
        paging.keyed_page("pools", -1, "%%%")
    assert [(v.field, v.reason) for v in info.value.violations] == [
        ("page_size", "OUT_OF_RANGE"),
        ("page_token", "INVALID_PAGE_TOKEN"),
    ]
