"""Ids as a person types them: a unique prefix stands for the whole id everywhere."""

from __future__ import annotations

import pytest

from gpufleet.cli.ids import IdError, resolve, resolve_all

IDS = [
    "8da88807-1111-4000-8000-000000000001",
    "8da88807-2222-4000-8000-000000000002",
    "8db00000-3333-4000-8000-000000000003",
    "f0000000-4444-4000-8000-000000000004",
]


@pytest.mark.parametrize(
    ("prefix", "found"),
    [
        ("f", IDS[3]),
        ("8db", IDS[2]),
        ("8da88807-1", IDS[0]),
        (IDS[1], IDS[1]),
        ("  f0  ", IDS[3]),
    ],
)
def test_a_unique_prefix_names_its_id(prefix: str, found: str) -> None:
    assert resolve(prefix, IDS, "job") == found


def test_an_exact_id_wins_over_longer_ones_it_starts() -> None:
    assert resolve("abc", ["abc", "abcd"], "job") == "abc"


def test_an_ambiguous_prefix_lists_every_candidate() -> None:
    with pytest.raises(IdError) as info:
        resolve("8da", IDS, "job", describe=lambda i: f"{i} QUEUED")
    text = str(info.value)
    assert "'8da' is the start of 2 job ids" in text
    assert f"{IDS[0]} QUEUED" in text and f"{IDS[1]} QUEUED" in text and IDS[2] not in text


def test_many_candidates_are_cut_with_a_count() -> None:
    many = [f"aa{n:034d}" for n in range(15)]
    with pytest.raises(IdError, match=r"\.\.\. and 5 more"):
        resolve("aa", many, "machine")


@pytest.mark.parametrize("prefix", ["zz", "8da88807-3", "not-an-id"])
def test_no_match_says_so(prefix: str) -> None:
    with pytest.raises(IdError, match=f"no job with an id starting '{prefix}'"):
        resolve(prefix, IDS, "job")


def test_an_empty_prefix_is_refused() -> None:
    with pytest.raises(IdError, match="empty"):
        resolve("  ", IDS, "job")


def test_whole_ids_need_no_listing_and_prefixes_list_once() -> None:
    listings = []

    def listing() -> list[str]:
        listings.append(1)
        return IDS

    assert resolve_all([IDS[0], IDS[3]], listing, "job") == [IDS[0], IDS[3]]
    assert listings == []
    out = resolve_all(["f", "8da", "8db", "x"], listing, "job")
    assert listings == [1]
    assert out[0] == IDS[3] and out[2] == IDS[2]
    assert isinstance(out[1], IdError) and isinstance(out[3], IdError)
