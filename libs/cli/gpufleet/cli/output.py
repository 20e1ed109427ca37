"""Rendering for the terminal (aligned tables) and for scripts (``--json``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp


def to_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def print_json(items: Sequence[Message] | Message) -> None:
    if isinstance(items, Message):
        json.dump(to_dict(items), sys.stdout, indent=2)
    else:
        json.dump([to_dict(m) for m in items], sys.stdout, indent=2)
    sys.stdout.write("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def fields(pairs: Sequence[tuple[str, str]]) -> str:
    """``name  value`` lines, the values aligned: one record's detail view."""
    width = max((len(name) for name, _ in pairs), default=0)
    return "\n".join(f"{name.ljust(width)}  {value}".rstrip() for name, value in pairs)


def when(ts: Timestamp, now: datetime | None = None) -> str:
    """A timestamp as an age ("3m ago") or "-" when unset."""
    if not ts.seconds and not ts.nanos:
        return "-"
    at = ts.ToDatetime(tzinfo=UTC)
    delta = ((now or datetime.now(UTC)) - at).total_seconds()
    return ago(delta)


def ago(seconds: float) -> str:
    future = seconds < 0
    s = abs(seconds)
    text = f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"
    return f"in {text}" if future else f"{text} ago"


def money(micros: int) -> str:
    return f"${micros / 1_000_000:,.4f}"


def enum_short(enum_type: Any, value: int, prefix: str) -> str:
    return str(enum_type.Name(value)).removeprefix(prefix)
