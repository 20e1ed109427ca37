"""Job tokens: their shape (typed, checksummed, recognisable) and the check's decision,
from tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.scheduler import tokens
from gpufleet.scheduler.tokens import Held, Refusal, Scope, decide

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("scope", list(Scope))
def test_a_token_names_its_scope_and_passes_its_own_checksum(scope: Scope) -> None:
    token = tokens.mint(scope)
    assert token.startswith(tokens.PREFIX[scope]) and len(token) == tokens.LENGTH
    assert tokens.scope_of(token) is scope
    assert token != tokens.mint(scope)


def test_a_typo_or_a_forgery_is_not_a_token() -> None:
    token = tokens.mint(Scope.MODEL)
    flipped = token[:10] + ("A" if token[10] != "A" else "B") + token[11:]
    assert tokens.scope_of(flipped) is None  # the CRC catches one changed character
    assert tokens.scope_of("gfx_" + token[4:]) is None
    assert tokens.scope_of(token[:-1]) is None
    assert tokens.scope_of(token + "A") is None
    assert tokens.scope_of(token[:20] + "é" + token[21:]) is None
    # A voice token with a model prefix fails its checksum: the prefix is inside it.
    assert tokens.scope_of("gfm_" + tokens.mint(Scope.VOICE)[4:]) is None


def test_only_the_hash_is_what_is_kept() -> None:
    token = tokens.mint(Scope.VOICE)
    assert tokens.digest(token) != token and len(tokens.digest(token)) == 64


def held(**changes: object) -> Held:
    base: dict[str, object] = dict(
        scope=Scope.MODEL,
        spend_cap_micros=1_000,
        spent_micros=0,
        expires_at=NOW + timedelta(hours=1),
        attempt_state="RUNNING",
    )
    base.update(changes)
    return Held(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("h", "asked", "spend", "refusal", "remaining"),
    [
        (held(), Scope.MODEL, 0, None, 1_000),
        (held(), Scope.MODEL, 400, None, 600),
        (held(attempt_state="STARTING"), Scope.MODEL, 0, None, 1_000),  # dispatched, not yet reported
        (None, Scope.MODEL, 0, Refusal.UNKNOWN, 0),
        (held(scope=Scope.VOICE), Scope.MODEL, 0, Refusal.WRONG_SCOPE, 0),  # narration is not a model token
        (held(), Scope.VOICE, 0, Refusal.WRONG_SCOPE, 0),
        (held(expires_at=NOW), Scope.MODEL, 0, Refusal.EXPIRED, 0),
        (held(spent_micros=1_000), Scope.MODEL, 0, Refusal.OVER_CAP, 0),
        (held(spent_micros=900), Scope.MODEL, 101, Refusal.OVER_CAP, 100),
        (held(spent_micros=900), Scope.MODEL, 100, None, 0),
        *[
            (held(attempt_state=state), Scope.MODEL, 0, Refusal.NOT_RUNNING, 0)
            for state in ("SUCCEEDED", "FAILED", "LOST", "TIMED_OUT", "CANCELLED", "INFRA_ERROR")
        ],
        (held(cancel_requested=True), Scope.MODEL, 0, Refusal.NOT_RUNNING, 0),
        # An ended attempt is refused as such even past its expiry and cap.
        (
            held(attempt_state="LOST", expires_at=NOW, spent_micros=5_000),
            Scope.MODEL,
            0,
            Refusal.NOT_RUNNING,
            0,
        ),
    ],
)
def test_decide(h: Held | None, asked: Scope, spend: int, refusal: Refusal | None, remaining: int) -> None:
    verdict = decide(h, asked, spend, NOW)
    assert verdict.refusal is refusal
    assert verdict.valid is (refusal is None)
    assert verdict.remaining_micros == remaining


def test_every_character_of_the_alphabet_is_drawn_about_equally_often() -> None:
    # 60,000 random characters: each of the 62 expected ~968 times. The bounds are ten
    # standard deviations wide — a biased mapping (say, modulo without rejection, or a
    # character never drawn) falls outside them; chance alone does not.
    counts = {c: 0 for c in tokens.ALPHABET}
    for _ in range(2000):
        for c in tokens.mint(Scope.MODEL)[4 : 4 + tokens.RANDOM_CHARS]:
            counts[c] += 1
    assert len(counts) == 62 and all(650 <= n <= 1290 for n in counts.values()), counts
