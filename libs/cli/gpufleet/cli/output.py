"""Rendering for the terminal (tables that fit it) and for scripts (``--json``)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

ELLIPSIS = "…"
GAP = "  "


def to_dict(message: Message) -> dict[str, Any]:
    """A message as a script wants it: 64-bit integers as numbers (proto's JSON mapping
    quotes them, so ``charge_micros`` needed an int() in every script) up to 2**53 — past
    that a reader that parses numbers as doubles (JavaScript, older jq) would change them,
    so protobuf keeps those quoted; no figure here comes near (2**53 micros is nine billion
    dollars) — and every field present, zero values included, so no key is missing."""
    return MessageToDict(
        message,
        preserving_proto_field_name=True,
        unquote_int64_if_possible=True,
        always_print_fields_with_no_presence=True,
    )


def print_json(items: Sequence[Message] | Message) -> None:
    if isinstance(items, Message):
        json.dump(to_dict(items), sys.stdout, indent=2)
    else:
        json.dump([to_dict(m) for m in items], sys.stdout, indent=2)
    sys.stdout.write("\n")


@dataclass(frozen=True)
class Col:
    """A table column. A ``flexible`` one (a message, a name) is cut short with "…" when the
    table is wider than the terminal; the others (ids, states, numbers) are never cut. An
    ``optional`` one is left out, right-most first, when cutting is not enough (``--json``
    and a wider terminal show it)."""

    header: str
    flexible: bool = False
    min_width: int = 8
    optional: bool = False


def terminal_width() -> int | None:
    """The terminal's width when stdout is one (or ``COLUMNS`` says); None for a pipe or a
    file, where a table is never cut: a script or grep gets every character."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def fit(widths: Sequence[int], columns: Sequence[Col], limit: int | None) -> list[int]:
    """Column widths whose table (with its gaps) fits ``limit``: the flexible columns give up
    width, widest first, down to their minimum; past that the table is left wider (an id
    is never cut)."""
    out = list(widths)
    if limit is None:
        return out
    excess = sum(out) + len(GAP) * (len(out) - 1) - limit
    while excess > 0:
        shrinkable = [
            i for i, c in enumerate(columns) if c.flexible and out[i] > max(c.min_width, len(c.header))
        ]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: out[i])
        out[widest] -= 1
        excess -= 1
    return out


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + ELLIPSIS


def table(headers: Sequence[str | Col], rows: Sequence[Sequence[str]], width: int | None = -1) -> str:
    """Aligned columns under their headers, fitted to ``width`` (default: the terminal's,
    none for a pipe). A header given as a plain string is a column that is never cut."""
    columns = [h if isinstance(h, Col) else Col(h) for h in headers]
    limit = terminal_width() if width == -1 else width
    natural = [len(c.header) for c in columns]
    for row in rows:
        natural = [max(w, len(cell)) for w, cell in zip(natural, row, strict=True)]
    keep = list(range(len(columns)))
    widths = fit(natural, columns, limit)
    optional = [i for i, c in enumerate(columns) if c.optional]
    while limit is not None and optional and sum(widths) + len(GAP) * (len(widths) - 1) > limit:
        keep.remove(optional.pop())
        widths = fit([natural[i] for i in keep], [columns[i] for i in keep], limit)
    columns = [columns[i] for i in keep]
    rows = [[row[i] for i in keep] for row in rows]

    def line(cells: Sequence[str]) -> str:
        return GAP.join(cut(c, w).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line([c.header for c in columns]), *(line(row) for row in rows)])


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


def say(text: str) -> None:
    """A line for the person at the terminal that is not the command's output (progress,
    outcomes): on stderr, so ``--json`` and a piped log stay clean."""
    print(text, file=sys.stderr, flush=True)
