"""Opaque page tokens shared by every List method.

A token is the base64 of a small JSON document naming the list it belongs to and the
position after the last row returned. A malformed token, or one from another list, is
INVALID_ARGUMENT naming ``page_token`` with the reason ``INVALID_PAGE_TOKEN``: the client
starts again from the first page.

Each check reports into the caller's :class:`~gpufleet.common.violations.Violations` (by
default it refuses at once) and then answers as for the first page, a value the handler
never uses because it refuses the request before reading the store.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from gpufleet.common.violations import AT_ONCE, Violations

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
INVALID_PAGE_TOKEN = "INVALID_PAGE_TOKEN"


def page_size(requested: int, found: Violations = AT_ONCE) -> int:
    if requested < 0:
        found.add("page_size", "must not be negative", "OUT_OF_RANGE")
        return DEFAULT_PAGE_SIZE
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    return min(requested, MAX_PAGE_SIZE)


def encode(kind: str, position: Any) -> str:
    raw = json.dumps({"k": kind, "p": position}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(kind: str, token: str, found: Violations = AT_ONCE) -> Any:
    """The position stored in ``token``, or None for the first page (and for a bad token,
    reported into ``found``)."""
    if not token:
        return None
    try:
        padded = token + "=" * (-len(token) % 4)
        doc = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        malformed(found)
        return None
    if not isinstance(doc, dict) or doc.get("k") != kind or "p" not in doc:
        found.add("page_token", f"page token does not belong to this {kind} list", INVALID_PAGE_TOKEN)
        return None
    return doc["p"]


def malformed(found: Violations = AT_ONCE) -> None:
    """A token that decodes but whose position is not what its list stores."""
    found.add("page_token", "malformed page token", INVALID_PAGE_TOKEN)


INT64_MAX = 2**63 - 1


def decode_int(kind: str, token: str, found: Violations = AT_ONCE) -> int | None:
    """A position that is a row number or id: an integer a database column can hold
    (0 .. 2**63-1); anything else in the token is INVALID_ARGUMENT, never a database
    error."""
    position = decode(kind, token, found)
    if position is None:
        return None
    if not isinstance(position, int) or isinstance(position, bool) or not 0 <= position <= INT64_MAX:
        malformed(found)
        return None
    return position


def decode_str(kind: str, token: str, found: Violations = AT_ONCE, *, max_length: int = 256) -> str | None:
    """A position that is a key (an id, a name)."""
    position = decode(kind, token, found)
    if position is None:
        return None
    if not isinstance(position, str) or len(position) > max_length:
        malformed(found)
        return None
    return position


def keyed_page(kind: str, requested: int, token: str) -> tuple[int, str]:
    """A request's ``page_size`` and ``page_token`` for a list ordered by a key (an id):
    the page's size and the key it starts after ("" for the first page), both fields
    checked at once."""
    found = Violations()
    size = page_size(requested, found)
    after = decode_str(kind, token, found) or ""
    found.raise_if_any()
    return size, after
