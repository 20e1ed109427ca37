"""Job tokens: minted when an attempt starts, checked by the model gateway and the voice
service through ``TokenService.CheckToken``, refused the moment the attempt stops running.

A token is opaque, typed and checksummed, so a secret scanner can recognise one and a typo
is told from a forgery without a database read::

    gfm_<30 base62 random><6 base62 CRC32>     a model token
    gfv_<30 base62 random><6 base62 CRC32>     a voice (narration) token

Only its SHA-256 is stored. The token names its workspace, job, attempt and scope through
its row, carries a spend cap (debited by each check that spends) and an expiry (the
attempt's time limit plus a margin).
"""

from __future__ import annotations

import enum
import hashlib
import secrets
import zlib
from dataclasses import dataclass
from datetime import datetime

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
RANDOM_CHARS = 30  # 178 bits
CRC_CHARS = 6


class Scope(enum.StrEnum):
    MODEL = "model"
    VOICE = "voice"


PREFIX = {Scope.MODEL: "gfm_", Scope.VOICE: "gfv_"}
SCOPE_OF_PREFIX = {v: k for k, v in PREFIX.items()}
LENGTH = 4 + RANDOM_CHARS + CRC_CHARS
# An attempt runs from its dispatch (STARTING: the job may already call out) until it ends.
LIVE = frozenset({"STARTING", "RUNNING"})


def _base62(value: int, width: int) -> str:
    out = []
    for _ in range(width):
        value, digit = divmod(value, 62)
        out.append(ALPHABET[digit])
    return "".join(reversed(out))


def checksum(body: str) -> str:
    return _base62(zlib.crc32(body.encode()), CRC_CHARS)


# Random bytes to characters, uniformly: a byte below 248 (= 4 x 62) is its value modulo
# 62; the eight above are dropped (rejection sampling), so every character is equally likely.
_TO_CHAR = bytes(ord(ALPHABET[b % 62]) for b in range(248)) + bytes(8)
_REJECTED = bytes(range(248, 256))


def mint(scope: Scope) -> str:
    """A new token of ``scope`` (never stored: keep :func:`digest` of it)."""
    return mint_many(scope, 1)[0]


def mint_many(scope: Scope, count: int) -> list[str]:
    """``count`` new tokens of ``scope``.

    Their characters come from one draw of the system's CSPRNG for all of them, mapped by
    rejection sampling in C (``bytes.translate``): a dispatch burst mints two tokens per
    attempt inside the assign commit, where a system call per token (let alone per
    character, as ``secrets.choice`` makes) also waits each time to take back the
    interpreter from the threads dispatching."""
    per = RANDOM_CHARS + 8  # 8 spare bytes: a byte is rejected with probability 1/32
    pool = secrets.token_bytes(per * count)
    out = []
    for i in range(count):
        chars = pool[i * per : (i + 1) * per].translate(_TO_CHAR, _REJECTED)
        while len(chars) < RANDOM_CHARS:  # more than 8 of 38 rejected: draw again
            chars += secrets.token_bytes(per).translate(_TO_CHAR, _REJECTED)
        body = PREFIX[scope] + chars[:RANDOM_CHARS].decode()
        out.append(body + checksum(body))
    return out


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def scope_of(token: str) -> Scope | None:
    """The scope a well-formed token claims; None for anything that is not one of ours
    (wrong length, prefix, alphabet or checksum)."""
    if len(token) != LENGTH or not token.isascii():
        return None
    scope = SCOPE_OF_PREFIX.get(token[:4])
    body, crc = token[:-CRC_CHARS], token[-CRC_CHARS:]
    if scope is None or any(c not in ALPHABET for c in token[4:]) or checksum(body) != crc:
        return None
    return scope


class Refusal(enum.StrEnum):
    MALFORMED = "malformed"
    UNKNOWN = "unknown"
    WRONG_SCOPE = "wrong_scope"
    EXPIRED = "expired"
    OVER_CAP = "over_cap"
    NOT_RUNNING = "not_running"


@dataclass(frozen=True)
class Held:
    """What a check reads of one token and its attempt."""

    scope: Scope
    spend_cap_micros: int
    spent_micros: int
    expires_at: datetime
    attempt_state: str
    # The job's cancel was asked for: its attempt is winding down, its tokens are done.
    cancel_requested: bool = False


@dataclass(frozen=True)
class Verdict:
    refusal: Refusal | None
    remaining_micros: int = 0

    @property
    def valid(self) -> bool:
        return self.refusal is None


def decide(held: Held | None, asked: Scope, spend_micros: int, now: datetime) -> Verdict:
    """May this token be used for ``asked``, spending ``spend_micros`` more? In order: an
    unknown token; a token of the other scope; its attempt no longer running (ended, lost,
    cancelled, timed out: at once, not at expiry); expired; over its cap."""
    if held is None:
        return Verdict(Refusal.UNKNOWN)
    if held.scope is not asked:
        return Verdict(Refusal.WRONG_SCOPE)
    if held.attempt_state not in LIVE or held.cancel_requested:
        return Verdict(Refusal.NOT_RUNNING)
    if now >= held.expires_at:
        return Verdict(Refusal.EXPIRED)
    remaining = held.spend_cap_micros - held.spent_micros
    if spend_micros > remaining or remaining <= 0:
        return Verdict(Refusal.OVER_CAP, max(remaining, 0))
    return Verdict(None, remaining - spend_micros)
