"""Job tokens out of the job's log, in every form a job might print one, before a byte of
it is written to disk (and so before it can leave the machine).

Forms caught, for each token of the attempt:

- raw, with any of its characters percent-encoded (``%67``) or JSON-escaped (``\\u0067``),
  in either case of hex;
- hex (``676d66…``), either case;
- base64, standard and URL-safe, padded or not, at each of the three byte offsets the
  token can start at inside a longer encoded blob (the characters that depend on the
  token's bytes alone);
- any of these broken by one line break between any two characters (a token wrapped or
  printed across two lines), and split across any number of writes: the redactor holds
  back the longest form's length before it lets bytes through.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable

REPLACEMENT = b"[REDACTED]"
_BREAK = rb"(?:\r?\n)?"


def _b64_cores(token: bytes) -> list[bytes]:
    """The base64 characters fixed by the token's bytes alone, at offsets 0, 1 and 2."""
    cores = []
    n = len(token)
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + token)
        first = -(-8 * k // 6)  # the first character whose 6 bits are all the token's
        last = (8 * (k + n)) // 6  # one past the last such character
        cores.append(encoded[first:last])
    return cores


def _spaced(parts: Iterable[bytes]) -> bytes:
    """One regex from per-character parts, allowing a line break between any two."""
    return _BREAK.join(parts)


def _either_case(h: int) -> bytes:
    """One hex digit, lower or upper case."""
    return b"[" + re.escape(bytes([h])) + re.escape(bytes([h]).upper()) + b"]"


def _char(c: int) -> bytes:
    """One character of the token, raw, percent-encoded or JSON-escaped."""
    hex_class = b"".join(_either_case(h) for h in f"{c:02x}".encode())
    return b"(?:" + re.escape(bytes([c])) + b"|%" + hex_class + rb"|\\u00" + hex_class + b")"


def patterns(token: str) -> list[bytes]:
    raw = token.encode()
    found = [_spaced(_char(c) for c in raw)]
    found.append(_spaced(_either_case(h) for h in raw.hex().encode()))
    for core in _b64_cores(raw):
        for variant in (core, core.replace(b"+", b"-").replace(b"/", b"_")):
            found.append(_spaced(re.escape(bytes([c])) for c in variant))
    return found


def _longest(token: str) -> int:
    """An upper bound on the bytes one match can span (every char escaped and broken)."""
    n = len(token.encode())
    return n * (6 + 2) + 2 * n * (1 + 2) + 16


class Redactor:
    """A stream filter: :meth:`feed` the job's output as it comes, :meth:`flush` at its end."""

    def __init__(self, secrets: Iterable[str]) -> None:
        tokens = [s for s in secrets if s]
        self._regex = (
            re.compile(b"|".join(b"(?:" + p + b")" for t in sorted(set(tokens)) for p in patterns(t)))
            if tokens
            else None
        )
        self._hold = max((_longest(t) for t in tokens), default=0)
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        if self._regex is None:
            return data
        self._buf += data
        out, rest = self._scrub(self._buf)
        keep = min(len(rest), self._hold)
        self._buf = rest[len(rest) - keep :]
        return out + rest[: len(rest) - keep]

    def flush(self) -> bytes:
        if self._regex is None:
            return b""
        out, rest = self._scrub(self._buf)
        self._buf = b""
        return out + rest

    def _scrub(self, data: bytes) -> tuple[bytes, bytes]:
        """What is settled (matches replaced) and the unmatched tail after the last match."""
        assert self._regex is not None
        pieces: list[bytes] = []
        pos = 0
        for m in self._regex.finditer(data):
            pieces.append(data[pos : m.start()])
            pieces.append(REPLACEMENT)
            pos = m.end()
        return b"".join(pieces), data[pos:]
