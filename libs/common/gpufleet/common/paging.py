"""Opaque page tokens shared by every List method.

A token is the base64 of a small JSON document naming the list it belongs to and the
position after the last row returned. A malformed token, or one from another list, is
INVALID_ARGUMENT naming ``page_token``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from gpufleet.common.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000


def page_size(requested: int) -> int:
    if requested < 0:
        raise InvalidArgument("must not be negative", field="page_size")
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    return min(requested, MAX_PAGE_SIZE)


def encode(kind: str, position: Any) -> str:
    raw = json.dumps({"k": kind, "p": position}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(kind: str, token: str) -> Any:
    """The position stored in ``token``, or None for the first page."""
    if not token:
        return None
    try:
        padded = token + "=" * (-len(token) % 4)
        doc = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument("malformed page token", field="page_token") from exc
    if not isinstance(doc, dict) or doc.get("k") != kind or "p" not in doc:
        raise InvalidArgument(f"page token does not belong to this {kind} list", field="page_token")
    return doc["p"]


INT64_MAX = 2**63 - 1


def decode_int(kind: str, token: str) -> int | None:
    """A position that is a row number or id: an integer a database column can hold
    (0 .. 2**63-1); anything else in the token is INVALID_ARGUMENT, never a database
    error."""
    position = decode(kind, token)
    if position is None:
        return None
    if not isinstance(position, int) or isinstance(position, bool) or not 0 <= position <= INT64_MAX:
        raise InvalidArgument("malformed page token", field="page_token")
    return position


def decode_str(kind: str, token: str, max_length: int = 256) -> str | None:
    """A position that is a key (an id, a name)."""
    position = decode(kind, token)
    if position is None:
        return None
    if not isinstance(position, str) or len(position) > max_length:
        raise InvalidArgument("malformed page token", field="page_token")
    return position
