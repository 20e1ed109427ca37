"""Ids as a person types them: a job's or a machine's id, or any unique prefix of it (the
8 characters every table shows), in every command that takes one.

The API takes whole ids only; the CLI lists what it may match and picks the one id that
starts with the prefix. No match or several is an error that names what to do: the
candidates of an ambiguous prefix are listed, so the next try can be exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

# A whole id (a UUID): used as given, with no listing; the server says if it is unknown.
WHOLE_ID_LENGTH = 36
# How many candidates an ambiguous prefix shows.
SHOWN = 10


class IdError(Exception):
    """A prefix that names no single id; the message says which and what to do."""


def is_whole(text: str) -> bool:
    return len(text) >= WHOLE_ID_LENGTH


def resolve(prefix: str, candidates: Iterable[str], what: str, describe: Callable[[str], str] = str) -> str:
    """The one id in ``candidates`` that starts with ``prefix`` (an exact match wins).

    ``what`` is the noun for messages ("job", "machine"); ``describe`` renders a candidate
    for the ambiguous case (an id with its state, say)."""
    prefix = prefix.strip()
    if not prefix:
        raise IdError(f"an empty {what} id")
    matches = sorted({c for c in candidates if c.startswith(prefix)})
    if prefix in matches:
        return prefix
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise IdError(f"no {what} with an id starting {prefix!r}")
    listed = "\n".join(f"  {describe(m)}" for m in matches[:SHOWN])
    more = f"\n  ... and {len(matches) - SHOWN} more" if len(matches) > SHOWN else ""
    raise IdError(
        f"{prefix!r} is the start of {len(matches)} {what} ids; give more of the one you mean:\n"
        f"{listed}{more}"
    )


def resolve_all(
    prefixes: Sequence[str],
    list_ids: Callable[[], Sequence[str]],
    what: str,
    describe: Callable[[str], str] = str,
) -> list[str | IdError]:
    """Each prefix resolved in order (an :class:`IdError` in place of one that names no
    single id), listing the candidates once and only when some prefix is not a whole id."""
    listed: Sequence[str] | None = None
    out: list[str | IdError] = []
    for prefix in prefixes:
        if is_whole(prefix):
            out.append(prefix.strip())
            continue
        if listed is None:
            listed = list_ids()
        try:
            out.append(resolve(prefix, listed, what, describe))
        except IdError as exc:
            out.append(exc)
    return out
